"""Triton SwiGLU activation, forward and backward: silu(gate) * up with torch's roundings (align.model.layers
.MistralMLP, align.model.moe's experts):

    forward:   s = gate / (1 + exp(-gate)) rounded to the dtype,  y = s * up rounded
    backward:  du = g * s rounded,  ds = g * up rounded,  dgate = ds * sig * (1 + gate (1 - sig)) rounded,
               sig = 1 / (1 + exp(-gate))    (torch's silu_backward formula)

The two inputs may be strided views (the two halves of a fused gate_up projection); one 2-D grid over
(rows, column blocks). silu(gate) is recomputed in backward, so only gate and up are saved (as unfused)."""

from __future__ import annotations

import torch

from align.kernels import triton_rt

tl = None  # triton.language, bound by triton_rt.jit at the first launch (Triton is an optional extra)

BLOCK = 1024


def _fwd_kernel(g_ptr, u_ptr, y_ptr, sg, su, sy, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    keep = offs < cols
    dt = y_ptr.dtype.element_ty
    a = tl.load(g_ptr + row * sg + offs, mask=keep, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + row * su + offs, mask=keep, other=0.0).to(tl.float32)
    s = (a / (1.0 + tl.exp(-a))).to(dt).to(tl.float32)
    tl.store(y_ptr + row * sy + offs, (s * u).to(dt), mask=keep)


def _bwd_kernel(g_ptr, u_ptr, d_ptr, dg_ptr, du_ptr, sg, su, sd, sdg, sdu, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    keep = offs < cols
    dt = dg_ptr.dtype.element_ty
    a = tl.load(g_ptr + row * sg + offs, mask=keep, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + row * su + offs, mask=keep, other=0.0).to(tl.float32)
    d = tl.load(d_ptr + row * sd + offs, mask=keep, other=0.0).to(tl.float32)
    sig = 1.0 / (1.0 + tl.exp(-a))
    s = (a / (1.0 + tl.exp(-a))).to(dt).to(tl.float32)
    ds = (d * u).to(dt).to(tl.float32)
    tl.store(du_ptr + row * sdu + offs, (d * s).to(dt), mask=keep)
    tl.store(dg_ptr + row * sdg + offs, (ds * sig * (1.0 + a * (1.0 - sig))).to(dt), mask=keep)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """(..., C) -> (R, C) with unit column stride (a view where possible)."""
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up):
        g2, u2 = _rows(gate), _rows(up)
        y = torch.empty(g2.shape, dtype=gate.dtype, device=gate.device)
        rows, cols = g2.shape
        if rows and cols:
            triton_rt.jit(_fwd_kernel)[(rows, -(-cols // BLOCK))](g2, u2, y, g2.stride(0), u2.stride(0),
                                                                   y.stride(0), cols, BLOCK=BLOCK)
        ctx.save_for_backward(g2, u2)
        ctx.shape = gate.shape
        return y.view(gate.shape)

    @staticmethod
    def backward(ctx, grad):
        g2, u2 = ctx.saved_tensors
        d2 = _rows(grad)
        dg, du = torch.empty_like(g2, memory_format=torch.contiguous_format), torch.empty_like(
            u2, memory_format=torch.contiguous_format)
        rows, cols = g2.shape
        if rows and cols:
            triton_rt.jit(_bwd_kernel)[(rows, -(-cols // BLOCK))](g2, u2, d2, dg, du, g2.stride(0), u2.stride(0),
                                                                   d2.stride(0), dg.stride(0), du.stride(0), cols,
                                                                   BLOCK=BLOCK)
        return dg.view(ctx.shape), du.view(ctx.shape)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Triton twin of F.silu(gate) * up, same shape and dtype (..., I)."""
    triton_rt.require(gate.device)
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise ValueError(f"swiglu: gate {tuple(gate.shape)} {gate.dtype} vs up {tuple(up.shape)} {up.dtype}")
    return _SwiGLU.apply(gate, up)
