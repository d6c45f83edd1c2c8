"""Triton RMSNorm, forward and backward, with align.model.layers.rms_norm's numerics:

    forward:  r = rsqrt(mean(x^2) + eps) in fp32,  n = (x * r) rounded to x's dtype,  y = w * n  (promoted dtype)
    backward: dn = (g * w) rounded to x's dtype (where autograd rounds the gradient of the cast),
              dx = r * dn - x * r^3 * mean(dn * x)   (fp32, rounded to x's dtype),   dw = sum_rows g * n (fp32 sums)

One program per row in forward (the row stays in registers: D <= 16384). Backward runs a bounded number of programs,
each over a contiguous band of rows, writing its partial dw to a (programs, D) fp32 buffer that one torch sum folds,
so no atomics and the same bits on every run."""

from __future__ import annotations

import torch

from align.kernels import triton_rt

tl = None  # triton.language, bound by triton_rt.jit at the first launch (Triton is an optional extra)

MAX_DIM = 16384


def _fwd_kernel(x_ptr, w_ptr, y_ptr, r_ptr, sx, sy, dim, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    keep = offs < dim
    x = tl.load(x_ptr + row * sx + offs, mask=keep, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(x * x, 0) / dim + eps)
    n = (x * r).to(x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=keep, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * sy + offs, (w * n).to(y_ptr.dtype.element_ty), mask=keep)
    tl.store(r_ptr + row, r)


def _bwd_kernel(x_ptr, w_ptr, g_ptr, r_ptr, dx_ptr, dw_ptr, sx, sg, sdx, rows, dim, band, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    keep = offs < dim
    w = tl.load(w_ptr + offs, mask=keep, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK,), tl.float32)
    start = pid * band
    stop = tl.minimum(start + band, rows)
    first = start.to(tl.int64)  # NOTE: pointers advance by a row per step (64-bit), no int32 row * stride product
    xp, gp, dxp, rp = x_ptr + first * sx, g_ptr + first * sg, dx_ptr + first * sdx, r_ptr + first
    for _ in range(start, stop):
        x = tl.load(xp + offs, mask=keep, other=0.0).to(tl.float32)
        g = tl.load(gp + offs, mask=keep, other=0.0).to(tl.float32)
        r = tl.load(rp)
        n = (x * r).to(x_ptr.dtype.element_ty).to(tl.float32)
        dw += g * n
        dn = (g * w).to(x_ptr.dtype.element_ty).to(tl.float32)
        dx = r * dn - x * (r * r * r) * (tl.sum(dn * x, 0) / dim)
        tl.store(dxp + offs, dx.to(dx_ptr.dtype.element_ty), mask=keep)
        xp, gp, dxp, rp = xp + sx, gp + sg, dxp + sdx, rp + 1
    tl.store(dw_ptr + pid.to(tl.int64) * dim + offs, dw, mask=keep)


def _block(dim: int) -> int:
    if dim > MAX_DIM:
        raise ValueError(f"Triton RMSNorm keeps a row in registers: dim {dim} > {MAX_DIM}")
    return max(16, 1 << (dim - 1).bit_length())


def _warps(dim: int) -> int:
    """Warps per program: the row spread over more threads as it grows (<= 16 values per thread up to 16384)."""
    return 4 if dim <= 2048 else 8 if dim <= 4096 else 16


def _bands(rows: int, dev: torch.device) -> int:
    """Programs of the backward: a few per SM on a GPU (each folds its band's dw), few under the interpreter."""
    n = 4 * torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 4
    return max(1, min(rows, n))


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps: float):
        dim = x.shape[-1]
        x2 = x.reshape(-1, dim)
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        out_dtype = torch.promote_types(weight.dtype, x.dtype)
        y = torch.empty(x2.shape, dtype=out_dtype, device=x.device)
        r = torch.empty(x2.shape[0], dtype=torch.float32, device=x.device)
        if x2.shape[0]:
            triton_rt.jit(_fwd_kernel)[(x2.shape[0],)](x2, weight.contiguous(), y, r, x2.stride(0), y.stride(0),
                                                        dim, float(eps), BLOCK=_block(dim), num_warps=_warps(dim))
        ctx.save_for_backward(x2, weight, r)
        ctx.x_shape = x.shape
        return y.view(*x.shape[:-1], dim)

    @staticmethod
    def backward(ctx, grad):
        x2, weight, r = ctx.saved_tensors
        rows, dim = x2.shape
        g = grad.reshape(-1, dim)
        if g.stride(-1) != 1:
            g = g.contiguous()
        dx = torch.empty_like(x2)
        bands = _bands(rows, x2.device)
        dw = torch.zeros(bands, dim, dtype=torch.float32, device=x2.device)
        if rows:
            band = -(-rows // bands)
            triton_rt.jit(_bwd_kernel)[(bands,)](x2, weight.contiguous(), g, r, dx, dw, x2.stride(0), g.stride(0),
                                                  dx.stride(0), rows, dim, band, BLOCK=_block(dim),
                                                  num_warps=_warps(dim))
        return dx.view(ctx.x_shape), dw.sum(0).to(weight.dtype), None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Triton twin of align.model.layers.rms_norm. x (..., D), weight (D,) -> (..., D) in promote(x, weight)."""
    triton_rt.require(x.device)
    return _RMSNorm.apply(x, weight, float(eps))
