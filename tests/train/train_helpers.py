"""Shared builders for tests/train: a tiny Mistral, synthetic SFT batches, an in-memory resumable loader."""

from __future__ import annotations

import torch

from align.model import MistralConfig, MistralForCausalLM


def tiny_config(**overrides) -> MistralConfig:
    base = dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=128, rope_theta=10000.0)
    base.update(overrides)
    return MistralConfig(**base)


def tiny_model(seed: int = 0, **overrides) -> MistralForCausalLM:
    torch.manual_seed(seed)
    return MistralForCausalLM(tiny_config(**overrides))


def sft_batch(b: int, t: int, vocab: int = 256, seed: int = 0) -> dict:
    """Right-padded rows with a masked prompt and a labelled answer of varying lengths."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (b, t), generator=g)
    lens = torch.randint(4, t + 1, (b,), generator=g)
    prompt = torch.randint(1, 4, (b,), generator=g)
    pos = torch.arange(t)[None]
    mask = pos < lens[:, None]
    labels = torch.where(mask & (pos >= prompt[:, None]), ids, torch.full_like(ids, -100))
    return {"input_ids": torch.where(mask, ids, torch.zeros_like(ids)), "labels": labels, "attention_mask": mask}


def split_rows(batch: dict, parts: int) -> list[dict]:
    n = batch["input_ids"].shape[0] // parts
    return [{k: v[i * n:(i + 1) * n] for k, v in batch.items()} for i in range(parts)]


class ListLoader:
    """Yields pre-built batches in order, forever (epoch after epoch); state = position, as the real loader's."""

    def __init__(self, batches: list[dict]):
        self.batches = batches
        self.pos = 0

    def __iter__(self):
        while True:
            batch = self.batches[self.pos % len(self.batches)]
            self.pos += 1
            yield batch

    def state_dict(self) -> dict:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.pos = int(state["pos"])


class FiniteLoader(ListLoader):
    """The windows once, then StopIteration (as BatchLoader with num_epochs set)."""

    def __iter__(self):
        while self.pos < len(self.batches):
            self.pos += 1
            yield self.batches[self.pos - 1]


def sft_windows(n_windows: int, accum: int, rows: int = 2, t: int = 16, vocab: int = 256, seed: int = 0):
    """`n_windows` accumulation windows of `accum` micro-batches each, all different."""
    return [[sft_batch(rows, t, vocab, seed=seed + 1000 * w + m) for m in range(accum)] for w in range(n_windows)]


def build_sft(run_dir, *, max_steps=6, checkpoint_every=2, accum=2, optimizer="adamw", fault=None, callbacks=(),
              model_seed=0, strategy="auto", loader=None, parallel=None, identity=None, model=None,
              base=None, module_kwargs=None, **train_overrides):
    """A Trainer over a tiny model and an endless in-memory loader. `fault(module, batch, accum_info)` runs before
    each micro-batch (it may raise, signal, or set `module.poison = True` to make every later loss NaN)."""
    from align.train.optim import OptimizerConfig
    from align.train.parallel import ParallelConfig
    from align.train.schedulers import SchedulerConfig
    from align.train.sft_loss import SftLossConfig
    from align.train.sft_module import SftTrainModule
    from align.train.train_module import TrainModuleConfig
    from align.train.trainer import Trainer, TrainerConfig

    class Module(base or SftTrainModule):
        poison = False

        def train_batch(self, batch, accum_info):
            if fault is not None:
                fault(self, batch, accum_info)
            return super().train_batch(batch, accum_info)

        def loss(self, model, batch):
            out = super().loss(model, batch)
            if self.poison:  # as a real overflow would: the loss and its logged sum are NaN
                out.loss = out.loss * float("nan")
                out.sums["ce_sum"] = out.sums["ce_sum"] * float("nan")
            return out

    model = tiny_model(model_seed) if model is None else model
    cfg = TrainModuleConfig(optimizer=OptimizerConfig(name=optimizer, lr=3e-3, weight_decay=0.1),
                            scheduler=SchedulerConfig(name="cosine", warmup_steps=2),
                            parallel=ParallelConfig(strategy=strategy, **(parallel or {})))
    module = Module(model, cfg, SftLossConfig(chunk_size=16), total_steps=max_steps, seed=7, **(module_kwargs or {}))
    loader = loader if loader is not None else ListLoader(sft_windows(5, accum))
    tcfg = TrainerConfig(max_steps=max_steps, checkpoint_every=checkpoint_every, **train_overrides)
    return Trainer(tcfg, module, loader, run_dir, list(callbacks), identity=identity)


def weights(module) -> dict:
    return {k: v.detach().clone() for k, v in module.full_model_state_dict().items()}


def assert_bitwise_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"


class Crash(Exception):
    """The failure `crash_and_resume` injects."""


def crash_and_resume(make_trainer, run_dir, at_micro: int, resumed_from: str):
    """Fit `make_trainer(run_dir, fault=...)` until its `at_micro`-th micro-batch raises, then fit a fresh trainer on
    the same run dir: it must resume from `resumed_from` and finish. Returns the resumed trainer."""

    def fault(module, batch, info, count=[0]):
        count[0] += 1
        if count[0] == at_micro:
            raise Crash()

    try:
        make_trainer(run_dir, fault=fault).fit()
        raise AssertionError("the fault did not fire")
    except Crash:
        pass
    resumed = make_trainer(run_dir)
    assert resumed.fit() == 0 and resumed.resumed_from.name == resumed_from, resumed.resumed_from
    return resumed
