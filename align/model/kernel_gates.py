"""The equivalence gates of align's Triton kernels (align.kernels.gate), one `GateSpec` per kernel name, and the
command that runs them and records the results the selector reads (align.kernels.select):

    python -m align.model.kernel_gates                   # every kernel, on CUDA (or the CPU interpreter under
    python -m align.model.kernel_gates --names rope,swiglu        TRITON_INTERPRET=1); exit 0 all passed, 1 not

Each case compares the Triton kernel with the torch path it replaces, on the same inputs: forward outputs and the
gradients of a fixed random cotangent (losses: of the loss itself). Cases per device kind:
  cuda       fp32 and bf16, shapes of a 1B-7B model's step (vocab 32768, hidden 2048-4096, 4096 tokens)
  interpret  fp32 and fp16 (the interpreter's bf16 arithmetic is wrong upstream), small shapes that still cross every
             block and chunk boundary (a vocabulary over one 4096-wide block, several chunks, odd sizes)
Tolerances (|c - r| <= abs_of_max * max|r| + rel * |r|): fp32 1e-5 / 1e-5 (summation order only), fp16 2e-3 /
2e-3 and bf16 1.6e-2 / 1.6e-2 (two units in the last place: a product rounded on one side of a tie, a sum of partial
sums). moe_permute must agree bit for bit in every dtype (gathers and the fixed-order fold).

It lives on the model layer, not in align/kernels: a gate's reference side is the model's torch code
(align.model.layers' rms_norm / RoPE, align.model.moe's gather_rows / unsort_rows), and align/kernels, the bottom
layer, may not import align.model (tests/foundation/test_layers.py)."""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn.functional as F

from align.kernels import fused_ce, fused_dpo, triton_moe, triton_norm, triton_rope, triton_swiglu, triton_rt
from align.kernels.gate import GateCase, GateSpec, Outputs, Tolerance, run_gate
from align.model import moe
from align.model.layers import apply_rope, rms_norm, rope_cos_sin

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
TOLERANCE = {F32: Tolerance(1e-5, 1e-5), F16: Tolerance(2e-3, 2e-3), BF16: Tolerance(1.6e-2, 1.6e-2)}


def _cases(dims_by_kind: dict[str, list[dict[str, int]]]) -> dict[str, tuple[GateCase, ...]]:
    dtypes = {"cuda": (F32, BF16), "interpret": (F32, F16)}
    return {kind: tuple(GateCase(" ".join(f"{k}={v}" for k, v in d.items()), dt, d)
                        for d in dims for dt in dtypes[kind]) for kind, dims in dims_by_kind.items()}


def _randn(gen, shape, dev, dtype, scale=1.0, grad=True):
    t = (torch.randn(shape, generator=gen) * scale).to(device=dev, dtype=dtype)
    return t.requires_grad_(grad)


def _grads(out: torch.Tensor, leaves: dict[str, torch.Tensor], cot: torch.Tensor | None) -> Outputs:
    got = torch.autograd.grad(out, list(leaves.values()), cot)
    return {f"grad_{k}": g for k, g in zip(leaves, got)}


# --- fused CE head (SFT) -------------------------------------------------------------------------------------------

def _ce_inputs(case, dev, gen):
    d = case.dims
    labels = torch.randint(0, d["vocab"], (d["tokens"],), generator=gen)
    labels[torch.rand(d["tokens"], generator=gen) < 0.1] = fused_ce.IGNORE_INDEX
    return {"h": _randn(gen, (d["tokens"], d["dim"]), dev, case.dtype),
            "w": _randn(gen, (d["vocab"], d["dim"]), dev, case.dtype, d["dim"] ** -0.5),
            "y": labels.to(dev), "chunk": d["chunk"]}


def _ce(rows: str):
    def run(i):
        out = fused_ce.fused_head(i["h"], i["w"], i["y"], rows, z_loss_weight=1e-4, chunk_size=i["chunk"])
        return {"loss": out.loss.detach(), "ce_sum": out.ce_sum, "entropy_sum": out.entropy_sum,
                **_grads(out.loss, {"h": i["h"], "w": i["w"]}, None)}
    return run


# --- per-sequence log-prob head (DPO / GRPO scoring) ---------------------------------------------------------------

def _lp_inputs(case, dev, gen):
    d = case.dims
    labels = torch.randint(0, d["vocab"], (d["batch"], d["seq"]), generator=gen)
    labels[:, : d["seq"] // 4] = fused_dpo.IGNORE_INDEX  # a prompt part without labels
    return {"h": _randn(gen, (d["batch"], d["seq"], d["dim"]), dev, case.dtype),
            "w": _randn(gen, (d["vocab"], d["dim"]), dev, case.dtype, d["dim"] ** -0.5),
            "y": labels.to(dev), "cot": torch.randn(d["batch"], generator=gen).to(dev), "chunk": d["chunk"]}


def _lp(use_triton: bool):
    def run(i):
        out = fused_dpo.sequence_logprobs_rows(i["h"], i["w"], i["y"], use_triton, chunk_size=i["chunk"])
        return {"logps": out.logps.detach(), **_grads(out.logps, {"h": i["h"], "w": i["w"]}, i["cot"])}
    return run


# --- RMSNorm, RoPE, SwiGLU -----------------------------------------------------------------------------------------

def _norm_inputs(case, dev, gen):
    d = case.dims
    return {"x": _randn(gen, (d["rows"], d["dim"]), dev, case.dtype, 3.0),
            "w": (1.0 + 0.1 * torch.randn(d["dim"], generator=gen)).to(dev, case.dtype).requires_grad_(),
            "cot": torch.randn(d["rows"], d["dim"], generator=gen).to(dev, case.dtype)}


def _norm(fn):
    def run(i):
        y = fn(i["x"], i["w"], 1e-5)
        return {"out": y.detach(), **_grads(y, {"x": i["x"], "w": i["w"]}, i["cot"])}
    return run


def _rope_inputs(case, dev, gen):
    d = case.dims
    shape = (d["batch"], d["seq"], d["heads"], d["head_dim"])
    pos = torch.arange(d["seq"], device=dev)[None] + 7  # (1, T): broadcast over the batch, as the model passes
    cos, sin = rope_cos_sin(pos, d["head_dim"], 1e6, case.dtype)
    return {"x": _randn(gen, shape, dev, case.dtype), "cos": cos, "sin": sin,
            "cot": torch.randn(shape, generator=gen).to(dev, case.dtype)}


def _rope(fn):
    def run(i):
        y = fn(i["x"], i["cos"], i["sin"])
        return {"out": y.detach(), **_grads(y, {"x": i["x"]}, i["cot"])}
    return run


def _swiglu_inputs(case, dev, gen):
    d = case.dims
    return {"gu": _randn(gen, (d["rows"], 2 * d["inter"]), dev, case.dtype, 3.0),  # halves: strided views
            "cot": torch.randn(d["rows"], d["inter"], generator=gen).to(dev, case.dtype)}


def _swiglu(fn):
    def run(i):
        gate, up = i["gu"].chunk(2, dim=-1)
        y = fn(gate, up)
        return {"out": y.detach(), **_grads(y, {"gu": i["gu"]}, i["cot"])}
    return run


def _torch_swiglu(gate, up):
    return F.silu(gate) * up


# --- MoE permute / unpermute ---------------------------------------------------------------------------------------

def _moe_inputs(case, dev, gen):
    d = case.dims
    ids = torch.stack([torch.randperm(d["experts"], generator=gen)[: d["top_k"]] for _ in range(d["tokens"])])
    return {"x": _randn(gen, (d["tokens"], d["dim"]), dev, case.dtype), "dispatch": moe.sort_by_expert(
        ids.to(dev), d["experts"]), "y": _randn(gen, (d["tokens"] * d["top_k"], d["dim"]), dev, case.dtype),
        "cot_p": torch.randn(d["tokens"] * d["top_k"], d["dim"], generator=gen).to(dev, case.dtype),
        "cot_u": torch.randn(d["tokens"], d["top_k"], d["dim"], generator=gen).to(dev, case.dtype)}


def _moe(triton: bool):
    def run(i):
        dp = i["dispatch"]
        if triton:
            xs = triton_moe.permute(i["x"], dp.order, dp.inverse, dp.top_k)
            un = triton_moe.unpermute(i["y"], dp.order, dp.inverse, dp.top_k)
        else:
            xs, un = moe.gather_rows(i["x"], dp), moe.unsort_rows(i["y"], dp)
        return {"permuted": xs.detach(), "unpermuted": un.detach(), **_grads(xs, {"x": i["x"]}, i["cot_p"]),
                **_grads(un, {"y": i["y"]}, i["cot_u"])}
    return run


def _spec(name, cuda, interpret, make, ref, cand, sources, exact=()):
    return GateSpec(name, _cases({"cuda": cuda, "interpret": interpret}), TOLERANCE, make, ref, cand,
                    tuple(f"align/kernels/{s}" for s in ("triton_rt.py", *sources)), exact_outputs=exact)


SPECS: dict[str, GateSpec] = {s.name: s for s in (
    _spec("fused_ce", [dict(tokens=4096, dim=2048, vocab=32768, chunk=1024)],
          [dict(tokens=40, dim=24, vocab=300, chunk=16), dict(tokens=6, dim=8, vocab=5000, chunk=4)],
          _ce_inputs, _ce("torch"), _ce("triton"), ("triton_ce.py", "fused_ce.py")),
    _spec("seq_logprob", [dict(batch=8, seq=512, dim=2048, vocab=32768, chunk=1024)],
          [dict(batch=3, seq=12, dim=24, vocab=300, chunk=8), dict(batch=2, seq=4, dim=8, vocab=5000, chunk=4)],
          _lp_inputs, _lp(False), _lp(True), ("triton_ce.py", "fused_dpo.py")),
    _spec("rms_norm", [dict(rows=8192, dim=4096), dict(rows=1000, dim=2048)],
          [dict(rows=37, dim=40), dict(rows=5, dim=200)],
          _norm_inputs, _norm(rms_norm), _norm(triton_norm.rms_norm), ("triton_norm.py",)),
    _spec("rope", [dict(batch=4, seq=2048, heads=32, head_dim=128), dict(batch=2, seq=1000, heads=8, head_dim=64)],
          [dict(batch=2, seq=7, heads=3, head_dim=16), dict(batch=1, seq=5, heads=4, head_dim=40)],
          _rope_inputs, _rope(apply_rope), _rope(triton_rope.apply_rope), ("triton_rope.py",)),
    _spec("swiglu", [dict(rows=8192, inter=14336), dict(rows=1000, inter=5632)],
          [dict(rows=6, inter=37), dict(rows=3, inter=1500)],
          _swiglu_inputs, _swiglu(_torch_swiglu), _swiglu(triton_swiglu.swiglu), ("triton_swiglu.py",)),
    _spec("moe_permute", [dict(tokens=8192, dim=2048, experts=64, top_k=8)],
          [dict(tokens=9, dim=24, experts=5, top_k=2), dict(tokens=4, dim=1100, experts=8, top_k=3)],
          _moe_inputs, _moe(False), _moe(True), ("triton_moe.py",),
          exact=("permuted", "unpermuted", "grad_x", "grad_y")),
)}


def summary_line(rec: dict) -> str:
    worst = max((o.get("err_over_bound", float("inf")) for c in rec["cases"] for o in c["outputs"].values()),
                default=0.0)
    return (f"{rec['name']:<12} {rec['kind']:<9} {'PASS' if rec['passed'] else 'FAIL'}  cases={len(rec['cases'])} "
            f"max err/bound={worst:.3g}  ({rec['device']})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--names", default=",".join(SPECS), help="comma-separated kernel names")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", help="also write every record into this one file")
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    reason = triton_rt.why_not(dev)
    if reason is not None:
        print(f"align.model.kernel_gates: {reason}", file=sys.stderr)
        return 2
    unknown = [n for n in args.names.split(",") if n not in SPECS]
    if unknown:
        print(f"align.model.kernel_gates: unknown kernel names {unknown}; known: {list(SPECS)}", file=sys.stderr)
        return 2
    records = [run_gate(SPECS[n], dev) for n in args.names.split(",")]
    for rec in records:
        print(summary_line(rec))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1, sort_keys=True)
    return 0 if all(r["passed"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
