"""Forward+backward tokens/s of align's Mistral vs transformers' on the same config, weights and batch.

Both fp32, SDPA attention, the same cross-entropy over full logits, the same thread count. Runs alternate
(align, transformers, align, ...) so machine noise hits both; the best and the median of the repeats are printed.
Prints ONE JSON line. Usage:

    .venv/bin/python bench/model_forward.py [--batch 8 --seq 256 --repeats 5 --steps 3 --threads 2 --clock wall]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import time

import torch
import torch.nn.functional as F

from align.model import MistralConfig, MistralForCausalLM


def step(model, ids, hf: bool) -> None:
    out = model(ids)
    logits = out.logits if hf else out
    loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    model.zero_grad(set_to_none=True)


def timed(model, ids, hf: bool, steps: int, clock) -> float:
    t0 = clock()
    for _ in range(steps):
        step(model, ids, hf)
    return ids.numel() * steps / (clock() - t0)


def build_hf(model: MistralForCausalLM):
    try:
        import transformers
    except ImportError:
        return None
    fields = {k: v for k, v in dataclasses.asdict(model.config).items() if k != "rope_theta"}
    rope = {"rope_type": "default", "rope_theta": model.config.rope_theta}
    cfg = transformers.MistralConfig(**fields, rope_parameters=rope)
    cfg._attn_implementation = "sdpa"
    twin = transformers.MistralForCausalLM(cfg)
    twin.load_state_dict(model.state_dict())
    return twin.train()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    # cpu: tokens per CPU-second of this process (time.process_time). With --threads 1 it is robust to other
    # processes competing for the cores, which wall-clock time is not; it ignores idle waits, so quote it as such.
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    args = ap.parse_args()
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = MistralConfig()  # the tiny profile shape: vocab 32768, d 256, 4 layers, 8/2 heads, ffn 768
    ours = MistralForCausalLM(cfg).train()
    theirs = build_hf(ours)
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq))
    step(ours, ids, False)  # warm-up: allocator, thread pools
    if theirs is not None:
        step(theirs, ids, True)
    rates: dict[str, list[float]] = {"align": [], "transformers": []}
    for _ in range(args.repeats):
        rates["align"].append(timed(ours, ids, False, args.steps, clock))
        if theirs is not None:
            rates["transformers"].append(timed(theirs, ids, True, args.steps, clock))
    result = {
        "bench": "model_forward", "what": "fp32 forward+CE+backward tokens/s", "batch": args.batch,
        "seq": args.seq, "threads": args.threads, "clock": args.clock, "config": dataclasses.asdict(cfg),
        "malloc": {k: os.environ[k] for k in ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_") if k in os.environ}
        or "glibc default", "torch": torch.__version__, "python": platform.python_version(),
    }
    for name, vals in rates.items():
        if vals:
            result[f"{name}_tok_s_best"] = round(max(vals), 1)
            result[f"{name}_tok_s_median"] = round(statistics.median(vals), 1)
    if rates["transformers"]:
        result["speedup_median"] = round(result["align_tok_s_median"] / result["transformers_tok_s_median"], 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
