"""Tokens per second of one MoE block forward + backward: align's SparseMoeBlock with the loop and the grouped
(torch grouped_mm) expert backends, beside the dense SwiGLU block of equal ACTIVE parameters (intermediate size
k * I) and transformers' OlmoeSparseMoeBlock (same weights; its "eager" experts, a one-hot loop with `index_add_`,
and its "grouped_mm" experts) when transformers is installed. Same machine, same thread count, interleaved
repetitions, median seconds per step; `max_abs_diff` is each MoE variant's output against align's loop (a fast
but wrong variant shows). Prints ONE JSON line.

`--clock cpu` times the process's CPU seconds (time.process_time): on a host shared with other jobs, use it with
`--threads 1`; wall-clock medians there moved by up to 10x between runs minutes apart (2 threads, load ~8).

Shape (default): d 256, I 128, 16 experts, top-4, 2048 tokens, fp32 (an OLMoE-1B-7B block at 1/8 width with a
quarter of its experts: k/E as OLMoE's 8/64).

    python bench/moe_step.py [--tokens 2048] [--hidden 256] [--inter 128] [--experts 16] [--top-k 4]
                             [--reps 7] [--threads 2] [--dtype float32] [--clock wall|cpu]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _block_fns(args, torch):
    from align.model.layers import MistralMLP
    from align.model.moe import SparseMoeBlock

    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    moe = SparseMoeBlock(args.hidden, args.inter, args.experts, args.top_k, False).to(dtype)
    for m in (moe.gate, moe.experts):
        m.init_parameters(0.02)
    dense = MistralMLP(args.hidden, args.top_k * args.inter).to(dtype)
    fns = {}

    def run_moe(backend):
        def step(x):
            moe.experts.backend = backend
            out, _ = moe(x)
            out.float().square().mean().backward()
            return out
        return step

    fns["align_loop"] = run_moe("loop")
    fns["align_grouped"] = run_moe("grouped")
    def run_dense(x):
        out = dense(x)
        out.float().square().mean().backward()
        return None  # another function: not compared

    fns["dense_equal_active"] = run_dense
    try:
        import transformers
        from transformers.models.olmoe.modeling_olmoe import OlmoeSparseMoeBlock
    except ImportError:
        return fns, moe
    for impl, name in (("eager", "transformers"), ("grouped_mm", "transformers_grouped_mm")):
        # NOTE: one config per block: the experts read config._experts_implementation at every forward
        hcfg = transformers.OlmoeConfig(hidden_size=args.hidden, intermediate_size=args.inter,
                                        num_experts=args.experts, num_experts_per_tok=args.top_k,
                                        norm_topk_prob=False)
        hcfg._experts_implementation = impl
        hf = OlmoeSparseMoeBlock(hcfg).to(dtype)
        hf.load_state_dict(moe.state_dict())
        fns[name] = _hf_step(hf)
    return fns, moe


def _hf_step(hf):
    def step(x):
        out = hf(x[None])[0]  # transformers' block unpacks (batch, seq, d)
        out.float().square().mean().backward()
        return out
    return step


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--inter", type=int, default=128)
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--top-k", type=int, default=4)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--clock", default="wall", choices=["wall", "cpu"])
    args = p.parse_args()
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    import torch

    torch.set_num_threads(args.threads)
    fns, _ = _block_fns(args, torch)
    x = torch.randn(args.tokens, args.hidden, generator=torch.Generator().manual_seed(1)).to(getattr(torch,
                                                                                                  args.dtype))
    times: dict[str, list[float]] = {k: [] for k in fns}
    outs = {name: fn(x.clone().requires_grad_(True)) for name, fn in fns.items()}  # warm-up + agreement
    diff = {name: float((o.detach().float() - outs["align_loop"].detach().float()).abs().max())
            for name, o in outs.items() if o is not None and name != "align_loop"}
    for _ in range(args.reps):
        for name, fn in fns.items():  # interleaved: drift on a shared host hits every side alike
            xi = x.clone().requires_grad_(True)
            t0 = clock()
            fn(xi)
            times[name].append(clock() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {"bench": "moe_step", "tokens": args.tokens, "hidden": args.hidden, "inter": args.inter,
           "experts": args.experts, "top_k": args.top_k, "dtype": args.dtype, "threads": args.threads,
           "reps": args.reps, "clock": args.clock, "torch": torch.__version__, "max_abs_diff": diff,
           "ms_per_step": {k: round(v * 1e3, 2) for k, v in med.items()},
           "tokens_per_s": {k: round(args.tokens / v) for k, v in med.items()},
           "grouped_vs_loop": round(med["align_loop"] / med["align_grouped"], 3)}
    if "transformers" in med:
        out["align_grouped_vs_transformers"] = round(med["transformers"] / med["align_grouped"], 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
