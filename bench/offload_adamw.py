"""Seconds per optimizer step and the bytes each optimizer keeps, on one decoder block's parameters of a given width:
torch AdamW (the reference), adamw8bit and offload_adamw (align.train.offload_adamw) side by side in one run, on CUDA
when there is one (parameters in bf16 on the GPU: offload_adamw's copies then cross the bus), else on this CPU
(parameters in `--dtype`). Prints ONE JSON line: per optimizer the median wall seconds per step after `--warmup`,
its device and host state bytes, and parameter elements per second.

    python bench/offload_adamw.py [--hidden 1024] [--steps 8] [--warmup 2] [--threads 2] [--dtype bfloat16]

Shape: a Mistral block of hidden H (q, o: H x H; k, v: H/4 x H; gate, up, down: 3.5 H x H; two norms), fresh random
gradients every step (drawn before the clock starts)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from align.train.adamw8bit import AdamW8bit  # noqa: E402
from align.train.offload_adamw import OffloadAdamW  # noqa: E402


def block_shapes(h: int) -> list[tuple[int, ...]]:
    i = int(3.5 * h)
    return [(h, h), (h // 4, h), (h // 4, h), (h, h), (i, h), (i, h), (h, i), (h,), (h,)]


def build(name: str, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.1,
                                 fused=True if params[0].device.type == "cpu" else None)
    if name == "adamw8bit":
        return AdamW8bit(params, lr=1e-4, weight_decay=0.1)
    return OffloadAdamW(params, lr=1e-4, weight_decay=0.1)


def state_bytes(opt: torch.optim.Optimizer) -> tuple[int, int]:
    dev = host = 0
    for s in opt.state.values():
        for v in s.values():
            if torch.is_tensor(v):
                n = v.numel() * v.element_size()
                if v.device.type == "cuda":
                    dev += n
                else:
                    host += n
    return dev, host


def run(name: str, shapes, dev: str, dtype: torch.dtype, steps: int, warmup: int) -> dict:
    g = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter((torch.randn(s, generator=g) * 0.02).to(dev, dtype)) for s in shapes]
    grads = [[torch.randn(s, generator=g).to(dev, dtype) for s in shapes] for _ in range(2)]
    opt = build(name, params)
    times = []
    for i in range(warmup + steps):
        for p, gr in zip(params, grads[i % 2]):
            p.grad = gr
        if dev == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.step()
        if dev == "cuda":
            torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    numel = sum(p.numel() for p in params)
    device_bytes, host_bytes = state_bytes(opt)
    if dev == "cpu":  # one memory: report it all as host
        device_bytes, host_bytes = 0, device_bytes + host_bytes
    sec = statistics.median(times)
    return {"s_per_step": round(sec, 5), "params_per_s": round(numel / sec), "state_device_bytes": device_bytes,
            "state_host_bytes": host_bytes}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if dev == "cuda" else getattr(torch, args.dtype)
    shapes = block_shapes(args.hidden)
    out = {"bench": "offload_adamw", "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
           "dtype": str(dtype).removeprefix("torch."), "hidden": args.hidden, "threads": args.threads,
           "params": sum(torch.Size(s).numel() for s in shapes)}
    for name in ("adamw", "adamw8bit", "offload_adamw"):
        out[name] = run(name, shapes, dev, dtype, args.steps, args.warmup)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
