"""Triton permute / unpermute of MoE tokens to experts and back, with align.model.moe's semantics, bit for bit:

    permute   (gather_rows):  x (N, d) -> x[order // k] (N*k, d), rows grouped by expert
              backward:       grad_x[t] = grad[inverse[t*k]] + grad[inverse[t*k+1]] + ...  left to right, rounded
                              to the dtype after each add (moe.fold_slots' order): a gather, never a scatter-add
    unpermute (unsort_rows):  y (N*k, d) in expert order -> y[inverse] as (N, k, d)
              backward:       grad_y = grad.flatten()[order]   (inverse is a permutation: a gather again)

Every output element is written by exactly one program and summed in a fixed order: deterministic on a GPU, where
index_add_ (autograd's backward of index_select) accumulates in whatever order atomics land."""

from __future__ import annotations

import torch

from align.kernels import triton_rt

tl = None  # triton.language, bound by triton_rt.jit at the first launch (Triton is an optional extra)

BLOCK = 1024


def _gather_kernel(src_ptr, idx_ptr, out_ptr, s_src, s_out, cols, div, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    keep = offs < cols
    src_row = tl.load(idx_ptr + row) // div
    v = tl.load(src_ptr + src_row * s_src + offs, mask=keep, other=0.0)
    tl.store(out_ptr + row * s_out + offs, v, mask=keep)


def _fold_kernel(g_ptr, inv_ptr, out_ptr, s_g, s_out, cols, k, BLOCK: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    keep = offs < cols
    dt = out_ptr.dtype.element_ty
    acc = tl.load(g_ptr + tl.load(inv_ptr + tok * k) * s_g + offs, mask=keep, other=0.0).to(tl.float32)
    for j in range(1, k):
        src = tl.load(inv_ptr + tok * k + j)
        v = tl.load(g_ptr + src * s_g + offs, mask=keep, other=0.0).to(tl.float32)
        acc = (acc + v).to(dt).to(tl.float32)
    tl.store(out_ptr + tok * s_out + offs, acc.to(dt), mask=keep)


def _gather(src: torch.Tensor, idx: torch.Tensor, div: int) -> torch.Tensor:
    src = src if src.stride(-1) == 1 else src.contiguous()
    out = torch.empty(idx.shape[0], src.shape[1], dtype=src.dtype, device=src.device)
    if out.numel():
        triton_rt.jit(_gather_kernel)[(idx.shape[0], -(-src.shape[1] // BLOCK))](
            src, idx.contiguous(), out, src.stride(0), out.stride(0), src.shape[1], div, BLOCK=BLOCK)
    return out


class _Permute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, order, inverse, top_k: int):
        ctx.save_for_backward(inverse)
        ctx.top_k, ctx.tokens = top_k, x.shape[0]
        return _gather(x, order, top_k)

    @staticmethod
    def backward(ctx, grad):
        (inverse,) = ctx.saved_tensors
        grad = grad if grad.stride(-1) == 1 else grad.contiguous()
        out = torch.empty(ctx.tokens, grad.shape[1], dtype=grad.dtype, device=grad.device)
        if out.numel():
            triton_rt.jit(_fold_kernel)[(ctx.tokens, -(-grad.shape[1] // BLOCK))](
                grad, inverse.contiguous(), out, grad.stride(0), out.stride(0), grad.shape[1], ctx.top_k,
                BLOCK=BLOCK)
        return out, None, None, None


class _Unpermute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, order, inverse, top_k: int):
        ctx.save_for_backward(order)
        return _gather(y, inverse, 1).unflatten(0, (-1, top_k))

    @staticmethod
    def backward(ctx, grad):
        (order,) = ctx.saved_tensors
        return _gather(grad.flatten(0, 1), order, 1), None, None, None


def permute(x: torch.Tensor, order: torch.Tensor, inverse: torch.Tensor, top_k: int) -> torch.Tensor:
    """Triton twin of align.model.moe.gather_rows: x (N, d) -> (N*k, d) in expert order."""
    triton_rt.require(x.device)
    return _Permute.apply(x, order, inverse, int(top_k))


def unpermute(y: torch.Tensor, order: torch.Tensor, inverse: torch.Tensor, top_k: int) -> torch.Tensor:
    """Triton twin of align.model.moe.unsort_rows: (N*k, d) in expert order -> (N, k, d) in token/slot order."""
    triton_rt.require(y.device)
    return _Unpermute.apply(y, order, inverse, int(top_k))
