"""The LM head's loss: align's fused chunked linear + CE beside the full-logits head (torch's cross_entropy on
`hidden @ W.T`), forward + backward, peak RSS growth and CPU seconds, each in its own process.

Shape: the SFT bench's head (2048 label tokens = batch 8 x 256, hidden 256, vocab 32768), fp32. Prints ONE JSON line.

    python bench/fused_ce.py [--tokens 2048] [--hidden 256] [--vocab 32768] [--chunk 1024] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def side(args) -> dict:
    import torch

    from align.kernels.fused_ce import fused_linear_cross_entropy, reference_linear_cross_entropy

    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    h = torch.randn(args.tokens, args.hidden, generator=g).requires_grad_()
    w = (torch.randn(args.vocab, args.hidden, generator=g) * 0.02).requires_grad_()
    y = torch.randint(0, args.vocab, (args.tokens,), generator=g)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cpu = []
    for _ in range(3):
        h.grad = w.grad = None
        c0 = time.process_time()
        if args.side == "fused":
            loss = fused_linear_cross_entropy(h, w, y, chunk_size=args.chunk).loss
        else:
            loss = reference_linear_cross_entropy(h, w, y)
        loss.backward()
        cpu.append(time.process_time() - c0)
    return {"peak_rss_growth_mib": round((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024, 1),
            "cpu_s_fwd_bwd": round(min(cpu), 4), "loss": round(float(loss), 6)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--side", choices=("fused", "full"))
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--chunk", type=int, default=1024)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    if args.side:
        print(json.dumps(side(args)))
        return
    out = {"bench": "fused_ce", "tokens": args.tokens, "hidden": args.hidden, "vocab": args.vocab,
           "chunk": args.chunk, "threads": args.threads, "dtype": "float32",
           "full_logits_mib": round(args.tokens * args.vocab * 4 / 2 ** 20, 1),
           "allocator": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")} or "glibc default",
           "load_avg_1m": round(os.getloadavg()[0], 2)}
    for name in ("fused", "full"):
        cmd = [sys.executable, __file__, "--side", name] + [f"--{k}={getattr(args, k)}" for k in
                                                            ("tokens", "hidden", "vocab", "chunk", "threads")]
        out[name] = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    out["memory_ratio_full_over_fused"] = round(out["full"]["peak_rss_growth_mib"]
                                                / max(out["fused"]["peak_rss_growth_mib"], 1e-9), 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
