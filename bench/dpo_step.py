"""Seconds per DPO optimizer step and peak RSS: align's DpoTrainModule (fused head, reference log-probs from the
cache, no reference model in memory) beside TRL's DPOTrainer (policy + reference model), same shape, same machine.

Shape (the tiny profile): Mistral vocab 32768, hidden 256, 4 layers, 8/2 heads, ffn 768, fp32; 4 pairs, 64 prompt +
128 completion tokens per arm; AdamW. Each side runs in its own process (peak RSS is per process); the reference
cache is built by a third process first, as the ref_cache stage would. TRL uses a one-character-per-token tokenizer
so its sequences have exactly the same lengths. Prints ONE JSON line.

    python bench/dpo_step.py [--steps 6] [--warmup 2] [--threads 2]
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
sys.path.insert(0, str(ROOT / "tests" / "dpo"))  # trl_fixtures: the TRL side's tokenizer and data
sys.path.insert(0, str(ROOT / "bench"))
from sides import run_side  # noqa: E402

PAIRS, PROMPT, COMPLETION = 4, 64, 128
SHAPE = dict(vocab_size=32768, hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=2)


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _align_model():
    import torch

    from align.model import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)  # the policy starts as the reference: same seed, same weights
    return MistralForCausalLM(MistralConfig(**SHAPE, pad_token_id=0))


def _align_batch():
    import torch

    from align.kernels.fused_dpo import IGNORE_INDEX

    g = torch.Generator().manual_seed(0)
    batch = {"pair_index": torch.arange(PAIRS)}
    for arm in ("chosen", "rejected"):
        ids = torch.randint(3, SHAPE["vocab_size"], (PAIRS, PROMPT + COMPLETION), generator=g)
        labels = ids.clone()
        labels[:, :PROMPT] = IGNORE_INDEX
        batch.update({f"{arm}_input_ids": ids, f"{arm}_labels": labels,
                      f"{arm}_attention_mask": torch.ones_like(ids, dtype=torch.bool)})
    return batch


def _cache_key():
    from align.train.ref_cache import RefCacheKey

    return RefCacheKey(reference="bench", shards="bench", tokenizer="bench", dtype="float32")


def side_cache(args) -> dict:
    import torch

    from align.kernels.fused_dpo import pair_logprobs
    from align.train.ref_cache import build_ref_cache

    model = _align_model().eval()

    def score(batch):
        with torch.no_grad():
            s = pair_logprobs(model, batch, chunk_size=args.chunk)
        return s.chosen, s.rejected, s.chosen_tokens, s.rejected_tokens

    build_ref_cache(args.cache, _cache_key(), PAIRS, [_align_batch()], score)
    return {"built": str(args.cache)}


def side_align(args) -> dict:
    from align.train.dpo_loss import DpoLossConfig
    from align.train.dpo_module import DpoTrainModule
    from align.train.optim import OptimizerConfig
    from align.train.ref_cache import RefCache
    from align.train.train_module import AccumInfo, TrainModuleConfig

    base = _rss_mb()
    cache = RefCache.open(args.cache, _cache_key(), PAIRS)
    model = _align_model()
    module = DpoTrainModule(model, TrainModuleConfig(optimizer=OptimizerConfig(lr=1e-5)),
                            DpoLossConfig(beta=0.1, chunk_size=args.chunk), cache, total_steps=1000)
    batch = _align_batch()
    times, cpu = [], []
    for _ in range(args.warmup + args.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        module.zero_grads()
        module.train_batch(batch, AccumInfo(0, 1, float(PAIRS), 1))
        module.optim_step()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return _result(times[args.warmup:], cpu[args.warmup:], base)


def side_trl(args) -> dict:
    import torch
    from trl_clock import StepClock
    from trl_fixtures import dpo_trainer, preference_texts, tiny_hf_mistral

    base = _rss_mb()
    shape = dict(vocab_size=SHAPE["vocab_size"], hidden=SHAPE["hidden_size"], layers=SHAPE["num_hidden_layers"],
                 heads=SHAPE["num_attention_heads"], kv_heads=SHAPE["num_key_value_heads"],
                 ffn=SHAPE["intermediate_size"])
    policy, ref = tiny_hf_mistral(seed=0, **shape), tiny_hf_mistral(seed=0, **shape)
    rows = preference_texts(PAIRS, prompt_chars=PROMPT, completion_chars=COMPLETION)
    steps = args.warmup + args.steps
    trainer = dpo_trainer(policy, ref, rows, str(args.cache.parent / "trl_out"), PAIRS, max_steps=steps,
                          learning_rate=1e-5, beta=0.1)
    lengths = {len(trainer.train_dataset[0][k]) for k in ("chosen_ids", "rejected_ids")}
    assert len(trainer.train_dataset[0]["prompt_ids"]) == PROMPT and lengths == {COMPLETION}, lengths

    timer = StepClock()
    trainer.add_callback(timer)
    torch.manual_seed(0)
    trainer.train()
    return _result(timer.wall[args.warmup:], timer.cpu[args.warmup:], base)


def _result(times: list[float], cpu: list[float], base_rss: float) -> dict:
    """Median wall and process-CPU seconds per step (CPU time is the figure that survives a shared machine)."""
    return {"s_per_step": round(statistics.median(times), 4), "cpu_s_per_step": round(statistics.median(cpu), 4),
            "steps_timed": len(times), "load_avg_1m": round(os.getloadavg()[0], 2),
            "peak_rss_mb": round(_peak_mb(), 1), "rss_after_imports_mb": round(base_rss, 1)}


def _run_side(side: str, args, cache: Path) -> dict:
    return run_side(__file__, side, {"cache": cache, "steps": args.steps, "warmup": args.warmup,
                                     "threads": args.threads, "chunk": args.chunk})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--side", choices=("cache", "align", "trl"))
    p.add_argument("--cache", type=Path)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--chunk", type=int, default=1024)
    args = p.parse_args()
    if args.side:
        import torch

        torch.set_num_threads(args.threads)
        print(json.dumps({"cache": side_cache, "align": side_align, "trl": side_trl}[args.side](args)))
        return
    try:
        import trl  # noqa: F401

        have_trl = True
    except ImportError:
        have_trl = False
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "ref_cache"
        _run_side("cache", args, cache)
        ours = _run_side("align", args, cache)
        theirs = _run_side("trl", args, cache) if have_trl else None
    out = {"bench": "dpo_step", "pairs": PAIRS, "prompt_tokens": PROMPT, "completion_tokens": COMPLETION,
           "model": SHAPE, "dtype": "float32", "threads": args.threads, "chunk_size": args.chunk,
           "allocator": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")} or "glibc default",
           "align": ours, "trl": theirs}
    if theirs:
        out["speedup_vs_trl"] = round(theirs["s_per_step"] / ours["s_per_step"], 2)
        out["cpu_speedup_vs_trl"] = round(theirs["cpu_s_per_step"] / ours["cpu_s_per_step"], 2)
        out["peak_rss_ratio_vs_trl"] = round(ours["peak_rss_mb"] / theirs["peak_rss_mb"], 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
