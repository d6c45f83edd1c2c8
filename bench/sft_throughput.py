"""SFT tokens/s and peak RSS: align's SFT Trainer (fused chunked CE head, tripwires, history) beside a plain
transformers + torch AdamW loop and TRL's SFTTrainer, same shape, same machine, same run.

Shape (issue 6): Mistral vocab 32768, hidden 256, 4 layers, 8/2 heads, ffn 768, fp32, batch 8 x 256 tokens (every
token a label), AdamW lr 1e-4, clip 1.0, 2 threads. Each side runs in its own process (peak RSS is per process).
align runs the real Trainer (the loop the SFT stage runs, with its probes and history), timed per optimizer step
by a callback; the final checkpoint is written after the timed steps. Prints ONE JSON line; wall figures depend on
the machine's load (reported), CPU seconds per step less so.

    python bench/sft_throughput.py [--steps 8] [--warmup 2] [--threads 2] [--chunk 1024] [--kernel auto|native|torch]

`--kernel torch` runs align's head with its per-row passes in torch ops, as before the C rows (csrc/ce_rows.c).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from sides import run_side  # noqa: E402

BATCH, SEQ = 8, 256
SHAPE = dict(vocab_size=32768, hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=2)
TOKENIZER = ROOT / "assets/tokenizer/mistral-7b-v0.3/tokenizer.json"


def _ids():
    import torch

    g = torch.Generator().manual_seed(0)
    return torch.randint(3, SHAPE["vocab_size"], (BATCH, SEQ), generator=g)


def _hf_model():
    import torch
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    cfg = MistralConfig(**SHAPE, head_dim=SHAPE["hidden_size"] // SHAPE["num_attention_heads"],
                        max_position_embeddings=SEQ, tie_word_embeddings=False, pad_token_id=0)
    return MistralForCausalLM(cfg)


class _Clock:
    def __init__(self):
        self.times, self.cpu, self.t0, self.c0 = [], [], None, None

    def start(self):
        self.t0, self.c0 = time.perf_counter(), time.process_time()

    def stop(self):
        self.times.append(time.perf_counter() - self.t0)
        self.cpu.append(time.process_time() - self.c0)


def side_align(args) -> dict:
    import torch

    from align.model import MistralConfig, MistralForCausalLM
    from align.train.callbacks import Callback, SpeedMonitor
    from align.train.optim import OptimizerConfig
    from align.train.probes import ProbeConfig, Tripwires
    from align.train.schedulers import SchedulerConfig
    from align.train.sft_loss import SftLossConfig
    from align.train.sft_module import SftTrainModule
    from align.train.train_module import TrainModuleConfig
    from align.train.trainer import Trainer, TrainerConfig

    torch.manual_seed(0)
    model = MistralForCausalLM(MistralConfig(**SHAPE, pad_token_id=0, max_position_embeddings=SEQ))
    cfg = TrainModuleConfig(optimizer=OptimizerConfig(lr=1e-4, max_grad_norm=1.0),
                            scheduler=SchedulerConfig(name="constant"))
    steps = args.warmup + args.steps
    module = SftTrainModule(model, cfg, SftLossConfig(chunk_size=args.chunk, kernel=args.kernel), total_steps=steps)
    ids = _ids()
    batch = {"input_ids": ids, "labels": ids.clone(), "attention_mask": torch.ones_like(ids, dtype=torch.bool)}

    class Loader:
        def __iter__(self):
            while True:
                yield [batch]

        def state_dict(self):
            return {}

        def load_state_dict(self, state):
            pass

    clock = _Clock()

    class Timer(Callback):
        name = "timer"

        def on_fit_start(self, trainer):
            clock.start()

        def on_step_end(self, trainer, metrics):
            clock.stop()
            clock.start()

    n_params = sum(p.numel() for p in model.parameters())
    callbacks = [SpeedMonitor(n_params), Tripwires(ProbeConfig(), list(model.parameters()), SHAPE["vocab_size"]),
                 Timer()]
    Trainer(TrainerConfig(max_steps=steps), module, Loader(), args.tmp / "align_run", callbacks).fit()
    return _result(clock, args)


def side_hf(args) -> dict:
    import torch

    model = _hf_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95))
    ids = _ids()
    clock = _Clock()
    for _ in range(args.warmup + args.steps):
        clock.start()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        clock.stop()
    return _result(clock, args)


def side_trl(args) -> dict:
    from datasets import Dataset
    from transformers import PreTrainedTokenizerFast, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    tok = PreTrainedTokenizerFast(tokenizer_file=str(TOKENIZER), pad_token="</s>", bos_token="<s>",
                                  eos_token="</s>")
    steps = args.warmup + args.steps
    rows = _ids().tolist()
    data = Dataset.from_dict({"input_ids": [rows[i % BATCH] for i in range(BATCH * steps)]})
    cfg = SFTConfig(output_dir=str(args.tmp / "trl_out"), per_device_train_batch_size=BATCH, max_length=SEQ,
                    max_steps=steps, learning_rate=1e-4, adam_beta2=0.95, max_grad_norm=1.0, report_to="none",
                    save_strategy="no", logging_steps=10 ** 6, use_cpu=True, dataloader_num_workers=0,
                    packing=False, lr_scheduler_type="constant", eos_token=None)
    trainer = SFTTrainer(model=_hf_model(), args=cfg, train_dataset=data, processing_class=tok)
    assert len(trainer.train_dataset[0]["input_ids"]) == SEQ
    clock = _Clock()

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            clock.start()

        def on_step_end(self, *a, **k):
            clock.stop()

    trainer.add_callback(Timer())
    trainer.train()
    return _result(clock, args)


def _result(clock: _Clock, args) -> dict:
    """Median wall / CPU seconds per step over the timed steps, tokens/s from the wall median, peak RSS."""
    wall, cpu = clock.times[args.warmup:], clock.cpu[args.warmup:]
    return {"tokens_per_s": round(BATCH * SEQ / statistics.median(wall), 1),
            "s_per_step": round(statistics.median(wall), 4), "cpu_s_per_step": round(statistics.median(cpu), 4),
            "steps_timed": len(wall), "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "load_avg_1m": round(os.getloadavg()[0], 2)}


def _run_side(side: str, args, tmp: str) -> dict:
    return run_side(__file__, side, {"tmp": tmp, "steps": args.steps, "warmup": args.warmup, "threads": args.threads,
                                     "chunk": args.chunk, "kernel": args.kernel})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--side", choices=("align", "hf", "trl"))
    p.add_argument("--tmp", type=Path)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--chunk", type=int, default=1024)
    p.add_argument("--kernel", choices=("auto", "native", "torch"), default="auto")
    args = p.parse_args()
    if args.side:
        import torch

        torch.set_num_threads(args.threads)
        print(json.dumps({"align": side_align, "hf": side_hf, "trl": side_trl}[args.side](args)))
        return
    out = {"bench": "sft_throughput", "batch": BATCH, "seq": SEQ, "model": SHAPE, "dtype": "float32",
           "threads": args.threads, "chunk_size": args.chunk, "kernel": args.kernel,
           "allocator": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")} or "glibc default"}
    with tempfile.TemporaryDirectory() as tmp:
        out["align"] = _run_side("align", args, tmp)
        for side, module in (("transformers_loop", "transformers"), ("trl_sft", "trl")):
            try:
                __import__(module)
            except ImportError:
                out[side] = None
                continue
            out[side] = _run_side("hf" if side == "transformers_loop" else "trl", args, tmp)
    for side in ("transformers_loop", "trl_sft"):
        if out.get(side):
            out[f"speedup_vs_{side}"] = round(out["align"]["tokens_per_s"] / out[side]["tokens_per_s"], 2)
            out[f"cpu_speedup_vs_{side}"] = round(out[side]["cpu_s_per_step"] / out["align"]["cpu_s_per_step"], 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
