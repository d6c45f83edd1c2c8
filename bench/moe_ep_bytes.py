"""All-to-all bytes of expert parallelism (align.model.moe_ep), counted against the analytic formula of seed 000
("Expert parallelism"), and the EP vs FSDP-of-experts traffic table for OLMoE-1B-7B shapes. Prints ONE JSON line.

Counted: `--world` gloo ranks on CPU (spawned here), one SparseMoeBlock under apply_expert_parallel, one forward and
one backward. Every torch.distributed.all_to_all_single call is counted by the bytes this rank sends to OTHER ranks;
the row all-to-alls (4 passes: dispatch, return, and their backward) apart from the small count messages. Two
routings:
  balanced  every token picks exactly k/ep experts on each EP rank (rigged logits): the formula must hold exactly;
  random    an OLMoE-shaped layer (d 2048, I 1024, E 64, k 8) with a trunc-normal(0.02) router on Gaussian tokens:
            within 10% (the share of rows that leave a rank is (ep-1)/ep only on average).

Analytic, per rank per micro-step (a share (ep-1)/ep of a token's k rows leaves its rank):
  EP                = 4 passes x layers x tokens x k x d x bytes x (ep-1)/ep
  FSDP of experts   = 3 collectives (all-gather forward, again in backward, reduce-scatter of the grads)
                      x layers x E x 3 d I x bytes x (W-1)/W
  crossover tokens  = 3 x 3 E I / (4 k)   (ep = W: EP moves less below it, FSDP above)

    python bench/moe_ep_bytes.py [--world 4] [--tokens 64] [--cases balanced,random]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

OLMOE = dict(hidden=2048, inter=1024, experts=64, top_k=8, layers=16)  # OLMoE-1B-7B
BALANCED = dict(hidden=64, inter=32, experts=16, top_k=4)  # k a multiple of ep (4): k/ep experts per EP rank
GIB = 2 ** 30


def ep_bytes(tokens: int, top_k: int, hidden: int, elem: int, ep: int, layers: int = 1) -> float:
    return 4 * layers * tokens * top_k * hidden * elem * (ep - 1) / ep


def fsdp_bytes(experts: int, hidden: int, inter: int, elem: int, world: int, layers: int = 1) -> float:
    return 3 * layers * experts * 3 * hidden * inter * elem * (world - 1) / world


def crossover_tokens(experts: int, inter: int, top_k: int) -> float:
    return 3 * 3 * experts * inter / (4 * top_k)


def table() -> dict:
    """OLMoE-1B-7B, bf16, ep = W = 4: GiB per rank per micro-step."""
    o, rows = OLMOE, []
    fsdp = fsdp_bytes(o["experts"], o["hidden"], o["inter"], 2, 4, o["layers"])
    for tokens in (1024, 4096, 16384, 32768):
        ep = ep_bytes(tokens, o["top_k"], o["hidden"], 2, 4, o["layers"])
        rows.append({"tokens_per_rank": tokens, "ep_gib": round(ep / GIB, 3), "fsdp_experts_gib": round(fsdp / GIB, 3),
                     "fsdp_over_ep": round(fsdp / ep, 2)})
    return {"shape": "OLMoE-1B-7B d2048 I1024 E64 k8 16 layers bf16 ep=W=4", "rows": rows,
            "crossover_tokens_per_rank": crossover_tokens(o["experts"], o["inter"], o["top_k"])}


class _Counter:
    """Wraps dist.all_to_all_single: bytes this rank sends to other ranks, rows and count messages apart."""

    def __init__(self, dist):
        self.dist, self.inner = dist, dist.all_to_all_single
        self.rows = self.counts = 0
        dist.all_to_all_single = self

    def __call__(self, out, inp, output_split_sizes=None, input_split_sizes=None, group=None, **kw):
        me, size = self.dist.get_rank(group), self.dist.get_world_size(group)
        elem = inp.element_size()
        if input_split_sizes is None:  # equal split: the count exchange
            self.counts += inp.numel() * elem * (size - 1) // size
        else:
            self.rows += elem * _row_numel(inp) * sum(n for j, n in enumerate(input_split_sizes) if j != me)
        return self.inner(out, inp, output_split_sizes=output_split_sizes, input_split_sizes=input_split_sizes,
                          group=group, **kw)


def _row_numel(t) -> int:
    n = 1
    for s in t.shape[1:]:
        n *= s
    return n


class _RiggedRouter:
    """Logits that give token t experts (t*m + i) % L + j*L for i < m = k/ep on every EP rank j (no ties)."""

    def __init__(self, torch, tokens: int, experts: int, top_k: int, ep: int):
        local, m = experts // ep, top_k // ep
        logits = torch.zeros(tokens, experts)
        for t in range(tokens):
            for j in range(ep):
                for i in range(m):
                    logits[t, j * local + (t * m + i) % local] = 10.0 + j * m + i
        self.logits = logits

    def __call__(self, x):
        return self.logits[:x.shape[0]].to(x.dtype) + x.sum(-1, keepdim=True) * 0


def _worker(rank: int, world: int, port: int, tokens: int, cases: list[str], out_path: str) -> None:
    import torch
    import torch.distributed as dist

    from align.model.moe import SparseMoeBlock
    from align.model.moe_ep import apply_expert_parallel, expert_parallel_groups

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    groups = expert_parallel_groups(world)
    counter = _Counter(dist)
    result = {}
    for name, shape in (("balanced", BALANCED), ("random", OLMOE)):
        if name not in cases:
            continue
        torch.manual_seed(0)
        block = SparseMoeBlock(shape["hidden"], shape["inter"], shape["experts"], shape["top_k"], False)
        block.gate.init_parameters(0.02)
        block.experts.init_parameters(0.02)
        if name == "balanced":
            block.gate.forward = _RiggedRouter(torch, tokens, shape["experts"], shape["top_k"], world)
        apply_expert_parallel(block, groups)
        block.experts.requires_grad_(False)  # the backward all-to-alls run for the input's gradient
        x = torch.randn(tokens, shape["hidden"], generator=torch.Generator().manual_seed(rank)).requires_grad_(True)
        counter.rows = counter.counts = 0
        out, _ = block(x)
        out.square().sum().backward()
        want = ep_bytes(tokens, shape["top_k"], shape["hidden"], 4, world)
        result[name] = {"counted_bytes": counter.rows, "analytic_bytes": want, "ratio": counter.rows / want,
                        "count_message_bytes": counter.counts, "received_rows": int(block.experts.received_rows)}
    gathered = [None] * world
    dist.all_gather_object(gathered, result)
    if rank == 0:
        Path(out_path).write_text(json.dumps(gathered))
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64, help="tokens per rank")
    ap.add_argument("--cases", default="balanced,random", help="comma-separated: balanced, random")
    args = ap.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    if not set(cases) <= {"balanced", "random"} or not cases:
        ap.error(f"--cases: expected some of balanced,random, got {args.cases!r}")
    import tempfile

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ranks.json")
        mp.spawn(_worker, args=(args.world, port, args.tokens, cases, path), nprocs=args.world, join=True)
        ranks = json.loads(Path(path).read_text())
    summary = {}
    for name in cases:
        ratios = [r[name]["ratio"] for r in ranks]
        summary[name] = {"ratio_min": min(ratios), "ratio_max": max(ratios),
                         "counted_bytes_per_rank": [r[name]["counted_bytes"] for r in ranks],
                         "analytic_bytes_per_rank": ranks[0][name]["analytic_bytes"],
                         "count_message_bytes_per_rank": ranks[0][name]["count_message_bytes"]}
    if "balanced" in cases:
        summary["balanced"]["exact"] = all(r["balanced"]["counted_bytes"] == r["balanced"]["analytic_bytes"]
                                           for r in ranks)
    if "random" in cases:
        summary["random"]["within_10pct"] = all(abs(r["random"]["ratio"] - 1) <= 0.10 for r in ranks)
    print(json.dumps({"bench": "moe_ep_bytes", "world": args.world, "ep": args.world, "tokens_per_rank": args.tokens,
                      "wire_dtype": "float32", "layers_counted": 1,
                      "shapes": {"balanced": BALANCED, "random": {k: v for k, v in OLMOE.items() if k != "layers"}},
                      "counted": summary, "table": table()}))


if __name__ == "__main__":
    main()
