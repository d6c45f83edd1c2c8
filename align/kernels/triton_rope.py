"""Triton rotary position embedding, forward and backward, with align.model.layers.apply_rope's numerics.

apply_rope computes x * cos + rotate_half(x) * sin in x's dtype, rotate_half(x) = (-x2, x1) on the halves of the
head dimension; each product and the sum are rounded to x's dtype. Here, per token row and per head:

    forward:   y1 = x1 c1 - x2 s1,   y2 = x2 c2 + x1 s2
    backward:  dx1 = g1 c1 + g2 s2,  dx2 = g2 c2 - g1 s1      (rotate_half's transpose)

in fp32 with the same roundings to x's dtype after each product and the sum (bitwise torch's in bf16, where a
product of two bf16 numbers is exact in fp32). cos/sin come from positions and take no gradient. One program per
token row reads all heads of the row and the row's cos/sin once."""

from __future__ import annotations

import torch

from align.kernels import triton_rt

tl = None  # triton.language, bound by triton_rt.jit at the first launch (Triton is an optional extra)


def _rope_kernel(x_ptr, c_ptr, s_ptr, y_ptr, heads, half, sx, sy, BACKWARD: tl.constexpr,
                 BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    keep = (h < heads) & (d < half)
    dt = y_ptr.dtype.element_ty
    xa = x_ptr + row * sx + h * (2 * half) + d
    x1 = tl.load(xa, mask=keep, other=0.0).to(tl.float32)
    x2 = tl.load(xa + half, mask=keep, other=0.0).to(tl.float32)
    cs = row * (2 * half) + d
    dkeep = d < half
    c1 = tl.load(c_ptr + cs, mask=dkeep, other=0.0).to(tl.float32)
    c2 = tl.load(c_ptr + cs + half, mask=dkeep, other=0.0).to(tl.float32)
    s1 = tl.load(s_ptr + cs, mask=dkeep, other=0.0).to(tl.float32)
    s2 = tl.load(s_ptr + cs + half, mask=dkeep, other=0.0).to(tl.float32)
    if BACKWARD:
        y1 = (x1 * c1).to(dt).to(tl.float32) + (x2 * s2).to(dt).to(tl.float32)
        y2 = (x2 * c2).to(dt).to(tl.float32) + (-(x1 * s1)).to(dt).to(tl.float32)
    else:
        y1 = (x1 * c1).to(dt).to(tl.float32) + (-(x2 * s1)).to(dt).to(tl.float32)
        y2 = (x2 * c2).to(dt).to(tl.float32) + (x1 * s2).to(dt).to(tl.float32)
    ya = y_ptr + row * sy + h * (2 * half) + d
    tl.store(ya, y1.to(dt), mask=keep)
    tl.store(ya + half, y2.to(dt), mask=keep)


def _launch(x3: torch.Tensor, cos2: torch.Tensor, sin2: torch.Tensor, backward: bool) -> torch.Tensor:
    rows, heads, dh = x3.shape
    y = torch.empty_like(x3)
    if rows:
        half = dh // 2
        triton_rt.jit(_rope_kernel)[(rows,)](x3, cos2, sin2, y, heads, half, x3.stride(0), y.stride(0),
                                              BACKWARD=backward, BLOCK_H=max(1, 1 << (heads - 1).bit_length()),
                                              BLOCK_D=max(16, 1 << (half - 1).bit_length()))
    return y


class _Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos2, sin2):
        x3 = x.reshape(-1, x.shape[-2], x.shape[-1]).contiguous()  # (rows, H, Dh)
        ctx.save_for_backward(cos2, sin2)
        ctx.x_shape = x.shape
        return _launch(x3, cos2, sin2, False).view(x.shape)

    @staticmethod
    def backward(ctx, grad):
        cos2, sin2 = ctx.saved_tensors
        g3 = grad.reshape(-1, grad.shape[-2], grad.shape[-1]).contiguous()
        return _launch(g3, cos2, sin2, True).view(ctx.x_shape), None, None


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Triton twin of align.model.layers.apply_rope: x (..., T, H, Dh), cos/sin (..., T, Dh) broadcast over heads."""
    triton_rt.require(x.device)
    if x.shape[-1] % 2:
        raise ValueError(f"RoPE needs an even head dimension, got {x.shape[-1]}")
    if cos.requires_grad or sin.requires_grad:
        raise ValueError("the Triton RoPE takes no gradient for cos/sin (they come from positions)")
    if x.dtype != cos.dtype or x.dtype != sin.dtype:
        raise ValueError(f"RoPE tables in {cos.dtype}/{sin.dtype} for {x.dtype} activations")
    lead = x.shape[:-2]
    # shape: (rows, Dh), one row of the tables per token row of x (a batch-broadcast table is expanded here)
    cos2 = cos.expand(*lead, x.shape[-1]).reshape(-1, x.shape[-1]).contiguous()
    sin2 = sin.expand(*lead, x.shape[-1]).reshape(-1, x.shape[-1]).contiguous()
    return _Rope.apply(x, cos2, sin2)
