"""The engine's matmul kernels on this host: ms per `x (rows, in) @ W^T (in -> out)` for `F.linear` (MKL sgemm in
fp32 on CPU: the model's own kernel, EngineConfig.linear_kernel="torch"), oneDNN on weights pre-packed once
(`_reorder_linear_weight` + `_linear_pointwise`: the engine's "onednn", "auto" for bf16 on a CPU) and align's C
kernel on 16-column panels (align/kernels/csrc/linear.c: "native", "auto" for fp32 on a CPU; fp32 only).

Shapes are the decode products of bench/generate.py's tiny and small Mistral shapes (heads and MLPs) at 16 rows (a
decode batch) and 128 rows (the GRPO load). Each product: 2 warm-up calls, then the median of `--repeats` timings of
`--calls` calls each, kernels alternating ("warm": the weights stay in the caches between calls), and the median
of `--cold` single calls each right after streaming 256 MB through the caches ("cold": how a decode step meets its
weights, since the 32k head evicts everything every step). Also printed: each product's GB/s of weights read (the
bound for few rows) and GMAC/s (the bound for many), and whether the kernels gave the same bits as MKL. Also
timed: the torch path's decode attention call (SDPA on 128 rows x 2 KV heads x 4 folded query rows x head dim 32, contiguous K/V) by key
length: its CPU flash kernel multiplies tiles through at::native::cpublas::gemm, MKL's few-row sgemm in fp32.
Prints ONE JSON line:

    .venv/bin/python bench/linear_kernels.py [--threads 1 --repeats 5 --calls 20 --cold 15 --dtype float32]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import torch
import torch.nn.functional as F

from align.inference.product_kernels import native_unsupported, onednn_linear, onednn_pack
from align.kernels import linear as native_linear
from align.model.checkpoint import DTYPES

PRODUCTS = {  # name: (out, in)
    "tiny_head": (32768, 256), "tiny_gate_up": (1536, 256), "tiny_down": (256, 768), "tiny_qkv": (384, 256),
    "small_head": (32768, 512), "small_gate_up": (3072, 512), "small_down": (512, 1536), "small_qkv": (768, 512),
}
ROWS = (16, 128)


def ms_per_call(fn, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e3


def cold_ms(fn, calls: int, flush: torch.Tensor) -> float:
    """Median ms of single calls, each after reading `flush` (more than any cache) so the weights come from DRAM."""
    times = []
    for _ in range(calls):
        flush.sum()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


@torch.inference_mode()
def measure(out_f: int, in_f: int, rows: int, dtype: torch.dtype, repeats: int, calls: int, cold: int,
            flush: torch.Tensor) -> dict:
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(out_f, in_f, generator=g) * 0.05).to(dtype)
    x = torch.randn(rows, in_f, generator=g).to(dtype)
    packed = onednn_pack(w)  # what the engine's "onednn" kernel runs (fused_layers.py)
    kernels = {"torch": lambda: F.linear(x, w), "onednn": lambda: onednn_linear(x, packed)}
    if native_unsupported(w) is None:
        panels = native_linear.pack(w)
        kernels["native"] = lambda: native_linear.linear(x, panels)
    for fn in kernels.values():
        fn(), fn()
    times: dict[str, list[float]] = {k: [] for k in kernels}
    for _ in range(repeats):
        for name, fn in kernels.items():
            times[name].append(ms_per_call(fn, calls))
    med = {k: statistics.median(v) for k, v in times.items()}
    cold_med = {k: cold_ms(fn, cold, flush) for k, fn in kernels.items()} if cold else {}
    weight_gb = out_f * in_f * w.element_size() / 1e9
    gmac = rows * out_f * in_f / 1e9
    reference = kernels["torch"]()
    return {**{f"{k}_ms": round(v, 3) for k, v in med.items()},
            **{f"{k}_cold_ms": round(v, 3) for k, v in cold_med.items()},
            "speedup": round(med["torch"] / med["onednn"], 2),
            **{f"{k}_weight_gb_s": round(weight_gb / (v / 1e3), 1) for k, v in med.items()},
            **{f"{k}_cold_weight_gb_s": round(weight_gb / (v / 1e3), 1) for k, v in cold_med.items()},
            **{f"{k}_gmac_s": round(gmac / (v / 1e3), 1) for k, v in med.items()},
            **{f"{k}_bitwise_equal_torch": bool(torch.equal(reference, fn())) for k, fn in kernels.items()
               if k != "torch"}}


@torch.inference_mode()
def decode_attention_ms(keys: int, repeats: int, calls: int, dtype: torch.dtype) -> float:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(128, 2, 4, 32, generator=g).to(dtype)
    k, v = (torch.randn(128, 2, keys, 32, generator=g).to(dtype) for _ in range(2))
    mask = torch.zeros(128, 1, 1, keys, dtype=dtype)
    fn = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # noqa: E731
    fn(), fn()
    return round(statistics.median(ms_per_call(fn, calls) for _ in range(repeats)), 3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--cold", type=int, default=15, help="cold single calls per kernel (0: none)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    args = ap.parse_args()
    if not torch.backends.mkldnn.is_available():
        raise SystemExit("bench/linear_kernels.py: this torch has no oneDNN")
    torch.set_num_threads(args.threads)
    flush = torch.ones(64 << 20 if args.cold else 1)  # 256 MB
    result = {"bench": "linear_kernels", "what": "ms per x @ W^T: MKL F.linear, oneDNN packed, native C panels",
              "dtype": args.dtype, "threads": args.threads, "repeats": args.repeats, "calls": args.calls,
              "cpu_capability": torch.backends.cpu.get_cpu_capability(), "processor": platform.processor() or None,
              "load_avg_1m_start": round(os.getloadavg()[0], 2), "torch": torch.__version__}
    for name, (out_f, in_f) in PRODUCTS.items():
        for rows in ROWS:
            result[f"{name}_{rows}"] = measure(out_f, in_f, rows, DTYPES[args.dtype], args.repeats, args.calls,
                                               args.cold, flush)
    result["decode_sdpa_ms_by_keys"] = {keys: decode_attention_ms(keys, args.repeats, args.calls, DTYPES[args.dtype])
                                        for keys in (32, 64, 96, 112, 128, 160, 192)}
    result["load_avg_1m_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
