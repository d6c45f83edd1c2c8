"""The engine's two attention paths over one layer's paged KV cache, on this host: ms per call (one call = one
layer of one decode step) for the "torch" path (gather each row's blocks into a padded tensor, then SDPA with an
additive mask: EngineConfig.cpu_kernels="torch", CUDA's path) and the "native" C kernel (align/kernels/csrc/
paged_attention.c: keys and values read from their blocks in place; the default on a CPU).

Cases: bench/generate.py's tiny (8 query / 2 KV heads, head dim 32) and small (head dim 64) shapes; 16 decode rows
(the b16 load) and 128 (the GRPO load, where 8 rows share their prompt's first 64 keys as the prefix cache makes
them), at several key lengths; blocks of 16 keys scattered over a cache sized like the engine's. Each case: 2
warm-up calls, then the median of `--repeats` timings of `--calls` calls each, paths alternating; also the largest
difference between the two outputs. Prints ONE JSON line:

    .venv/bin/python bench/paged_attention.py [--threads 1 --repeats 5 --calls 20]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from linear_kernels import ms_per_call  # noqa: E402  (the same timing loop as the matmul bench)

from align.inference.paged_attention import (  # noqa: E402
    NativeAttention, build_group, build_native_plan, group_attention, native_cache_shapes, native_write_kv, write_kv)

SHAPES = {"tiny": (8, 2, 32), "small": (8, 2, 64)}  # query heads, KV heads, head dim
BLOCK = 16
CACHE_BLOCKS = 4096


def tables(rows: int, keys: int, shared: int, group: int, rng: random.Random) -> list[list[int]]:
    """Block tables of `rows` rows of `keys` keys; rows in groups of `group` share their first `shared` keys."""
    free = list(range(1, CACHE_BLOCKS))
    rng.shuffle(free)
    out, prefix = [], []
    for r in range(rows):
        if r % group == 0:
            prefix = [free.pop() for _ in range(shared // BLOCK)]
        out.append(prefix + [free.pop() for _ in range(-(-keys // BLOCK) - len(prefix))])
    return out


@torch.inference_mode()
def measure(shape: str, rows: int, keys: int, shared: int, repeats: int, calls: int) -> dict:
    heads, kv_heads, dh = SHAPES[shape]
    rng, g = random.Random(0), torch.Generator().manual_seed(0)
    block_tables = tables(rows, keys, shared, 8, rng)
    std = (CACHE_BLOCKS + 1, BLOCK, kv_heads, dh)
    k_std, v_std = torch.zeros(std), torch.zeros(std)
    k_nat, v_nat = (torch.zeros(s[1:]) for s in native_cache_shapes(1, CACHE_BLOCKS + 1, BLOCK, kv_heads, dh))
    slots = torch.tensor(sorted({b * BLOCK + o for t in block_tables for b in t for o in range(BLOCK)}))
    k, v = torch.randn(len(slots), kv_heads, dh, generator=g), torch.randn(len(slots), kv_heads, dh, generator=g)
    write_kv(k_std, v_std, slots, k, v)
    native_write_kv(k_nat, v_nat, slots, k, v)
    q = torch.randn(rows, heads, dh, generator=g)
    starts = [keys - 1] * rows  # each row decodes its token at position keys - 1
    group = build_group(starts, [1] * rows, block_tables, BLOCK, slice(0, rows), None, torch.float32)
    plan = build_native_plan([(s, 1, t) for s, t in zip(starts, block_tables)], rows, BLOCK, None,
                             CACHE_BLOCKS + 1)
    native = NativeAttention()
    paths = {"torch": lambda: group_attention(q, k_std, v_std, group),
             "native": lambda: native(q, k_nat, v_nat, plan, None)}
    for fn in paths.values():
        fn(), fn()
    times: dict[str, list[float]] = {p: [] for p in paths}
    for _ in range(repeats):
        for name, fn in paths.items():
            times[name].append(ms_per_call(fn, calls))
    med = {p: statistics.median(t) for p, t in times.items()}
    return {**{f"{p}_ms": round(m, 3) for p, m in med.items()}, "speedup": round(med["torch"] / med["native"], 2),
            "max_abs_diff": float((paths["torch"]() - paths["native"]()).abs().max())}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--calls", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    result = {"bench": "paged_attention", "what": "ms per layer call, gather + SDPA vs native C, decode rows",
              "threads": args.threads, "repeats": args.repeats, "calls": args.calls, "block_size": BLOCK,
              "cpu_capability": torch.backends.cpu.get_cpu_capability(), "processor": platform.processor() or None,
              "load_avg_1m_start": round(os.getloadavg()[0], 2), "torch": torch.__version__}
    for shape in SHAPES:
        for rows, shared in ((16, 0), (128, 64)):
            for keys in (64, 96, 128, 192):
                result[f"{shape}_{rows}rows_{keys}keys"] = measure(shape, rows, keys, shared, args.repeats,
                                                                   args.calls)
    result["load_avg_1m_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
