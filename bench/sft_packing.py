"""SFT throughput and padding, padded vs packed batches, on the bundled tiny SFT shards with the tiny profile's model.

Each variant runs the real loop the SFT stage runs (BatchLoader -> SftTrainModule -> Trainer, fused CE head) from
the same initial weights for `--warmup + --steps` optimizer steps, timed per step by a callback (collation
included: the loader is iterated inside the loop). tokens/s counts real (non-pad) input tokens; `padding` is the
share of the batch tensors that is padding, measured over the timed steps and, for the whole of epoch 0, from the
loader's plan. Beside our packed variants: the row count transformers' TRL `pack_dataset` (best-fit decreasing,
the reference packer) needs for the same conversations at the same seq_len, when trl is installed.

    python bench/sft_packing.py [--shards runs/tiny/shards/sft/out] [--steps 10] [--warmup 2] [--rounds 2]

Prints ONE JSON line. Variants are `name=packing:seq_len:micro_batch_size` (packing "none" ignores seq_len); the
default set keeps ~2,000 token slots per micro-batch pair (grad_accum 2), like the tiny profile's 16-row batches."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VARIANTS = ("padded=none:0:16", "greedy256=greedy:256:4", "ffd256=ffd:256:4", "ffd512=ffd:512:2",
            "ffd128=ffd:128:8")


def _variant(spec: str, grad_accum: int):
    from align.data.loader import LoaderConfig

    name, rest = spec.split("=")
    packing, seq_len, micro = rest.split(":")
    kw = {"seq_len": int(seq_len)} if packing != "none" else {}
    return name, LoaderConfig(micro_batch_size=int(micro), grad_accum=grad_accum, packing=packing, **kw)


def run_variant(shards, loader_cfg, model_cfg, args, run_dir: Path) -> dict:
    import torch

    from align.data.loader import BatchLoader
    from align.model import MistralForCausalLM
    from align.train.callbacks import Callback
    from align.train.optim import OptimizerConfig
    from align.train.schedulers import SchedulerConfig
    from align.train.sft_loss import SftLossConfig
    from align.train.sft_module import SftTrainModule
    from align.train.train_module import TrainModuleConfig
    from align.train.trainer import Trainer, TrainerConfig

    torch.manual_seed(0)
    model = MistralForCausalLM(model_cfg)
    steps = args.warmup + args.steps
    module = SftTrainModule(model, TrainModuleConfig(optimizer=OptimizerConfig(lr=3e-3, max_grad_norm=1.0),
                                                     scheduler=SchedulerConfig(name="constant")),
                            SftLossConfig(), total_steps=steps)
    loader = BatchLoader(shards, loader_cfg, seed=0)
    rows: list[dict] = []

    class Timer(Callback):
        name = "timer"

        def on_fit_start(self, trainer):
            self.t0, self.c0 = time.perf_counter(), time.process_time()

        def on_step_end(self, trainer, metrics):
            now, cpu = time.perf_counter(), time.process_time()
            rows.append({"s": now - self.t0, "cpu": cpu - self.c0, "tokens": metrics["input_tokens"],
                         "loss": metrics["loss"]})
            self.t0, self.c0 = now, cpu

    Trainer(TrainerConfig(max_steps=steps, checkpoint_every=0), module, loader, run_dir, [Timer()]).fit()
    return rows[args.warmup:]


def summarise(timed: list[dict], loader_cfg, epoch: dict) -> dict:
    """Throughput over every timed step of every round: wall (contended host) and CPU seconds (less so)."""
    slots = (loader_cfg.seq_len * loader_cfg.micro_batch_size * loader_cfg.grad_accum
             if loader_cfg.packing != "none" else None)
    tokens = sum(r["tokens"] for r in timed)
    return {"tokens_per_s": round(tokens / sum(r["s"] for r in timed), 1),
            "tokens_per_cpu_s": round(tokens / sum(r["cpu"] for r in timed), 1),
            "s_per_step": round(statistics.median(r["s"] for r in timed), 4),
            "cpu_s_per_step": round(statistics.median(r["cpu"] for r in timed), 4),
            "real_tokens_per_step": round(tokens / len(timed), 1), "slots_per_step": slots,
            "epoch0_padding": round(epoch["padding_fraction"], 4), "epoch0_batch_rows": epoch["batch_rows"]}


def trl_rows(shards, seq_len: int) -> int | None:
    """Rows TRL's best-fit-decreasing packer needs for the same conversations (None without trl)."""
    try:
        from datasets import Dataset
        from trl import pack_dataset
    except ImportError:
        return None
    ids = [shards.sequence(r)[0].tolist() for r in range(len(shards))]
    return len(pack_dataset(Dataset.from_dict({"input_ids": ids}), seq_length=seq_len, strategy="bfd"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shards", default=str(ROOT / "runs/tiny/shards/sft/out"))
    p.add_argument("--config", default=str(ROOT / "configs/tiny/sft.toml"), help="model shape from [model.init]")
    p.add_argument("--steps", type=int, default=10, help="timed steps per variant per round")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--grad-accum", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2, help="variants run interleaved, round after round")
    p.add_argument("--variants", nargs="*", default=list(VARIANTS))
    args = p.parse_args()
    import torch

    from align.config import load_config
    from align.data.store import ShardSet
    from align.stages.sft import SftStageConfig

    torch.set_num_threads(args.threads)
    shards = ShardSet.open(args.shards, kind="sft")
    model_cfg = load_config(Path(args.config), SftStageConfig).model.init
    out = {"bench": "sft_packing", "shards": args.shards, "rows": len(shards), "tokens": shards.manifest["tokens"],
           "model": {"hidden": model_cfg.hidden_size, "layers": model_cfg.num_hidden_layers,
                     "vocab": model_cfg.vocab_size}, "dtype": "float32", "threads": args.threads,
           "steps_timed": args.steps, "grad_accum": args.grad_accum,
           "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"),
           "allocator": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")} or "glibc default"}
    variants = dict(_variant(spec, args.grad_accum) for spec in args.variants)
    timed: dict[str, list[dict]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):  # interleaved: a burst of load on the shared host hits every variant
            for name, cfg in variants.items():
                timed[name] += run_variant(shards, cfg, model_cfg, args, Path(tmp) / f"{name}-{r}")
    from align.data.loader import BatchLoader

    for name, cfg in variants.items():
        res = summarise(timed[name], cfg, BatchLoader(shards, cfg, seed=0).epoch_stats(0))
        if cfg.packing != "none":
            res["trl_bfd_rows"] = trl_rows(shards, cfg.seq_len)
        out[name] = {"packing": cfg.packing, "seq_len": cfg.seq_len if cfg.packing != "none" else None,
                     "micro_batch_size": cfg.micro_batch_size, **res}
    base = out.get("padded", {}).get("tokens_per_s")
    base_cpu = out.get("padded", {}).get("tokens_per_cpu_s")
    for key in variants:
        if base and key != "padded":
            out[key]["speedup_vs_padded"] = round(out[key]["tokens_per_s"] / base, 2)
            out[key]["cpu_speedup_vs_padded"] = round(out[key]["tokens_per_cpu_s"] / base_cpu, 2)
    out["load_avg_1m"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
