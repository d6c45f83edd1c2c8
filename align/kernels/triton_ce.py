"""Triton row passes of the fused LM heads: the GPU counterpart of align/kernels/csrc/ce_rows.c.

The heads (align.kernels.fused_ce for SFT's summed CE, align.kernels.fused_dpo for per-sequence log-probs) form one
`[chunk, vocab]` fp32 logits chunk at a time with a cuBLAS GEMM and hand it here; the two GEMMs of the gradients
stay cuBLAS too. What Triton fuses is everything between: torch needs a log_softmax, an exp, a gather, a scale and
a scatter (five passes over the chunk and a second `[chunk, vocab]` buffer); one program per row here reads the row
twice and writes it once, in place, with no second buffer.

`ce_rows_`: per row i (target y_i), online over vocabulary blocks of BLOCK:
    m = max_v x_v,  s = sum_v exp(x_v - m),  t = sum_v exp(x_v - m) x_v
    lse = m + log s,  ce = lse - x_y,  entropy = lse - t / s
  and with `grad`, the row becomes d loss / d logits = exp(x - lse) * (1 + 2 z lse) - onehot(y)   (fused_ce's)
`softmax_grad_rows_`: with a saved lse and a per-row scale g, the row becomes g * (exp(x - lse) - onehot(y))
  (the log-prob head's backward with g = -d loss / d logp)."""

from __future__ import annotations

import torch

from align.kernels import triton_rt

tl = None  # triton.language, bound by triton_rt.jit at the first launch (Triton is an optional extra)

BLOCK = 4096  # vocabulary elements per step of a row's loop
WARPS = 8  # 4096 fp32 over 256 threads: 16 registers per live block value


def _ce_rows_kernel(x_ptr, stride, y_ptr, vocab, z_w, lse_ptr, ce_ptr, ent_ptr,
                    GRAD: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    base = x_ptr + row.to(tl.int64) * stride
    y = tl.load(y_ptr + row)
    m = tl.full((), float("-inf"), tl.float32)
    s = tl.zeros((), tl.float32)
    t = tl.zeros((), tl.float32)
    for start in range(0, vocab, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        keep = offs < vocab
        x = tl.load(base + offs, mask=keep, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, 0))
        scale = tl.exp(m - m_new)
        e = tl.where(keep, tl.exp(x - m_new), 0.0)
        s = s * scale + tl.sum(e, 0)
        t = t * scale + tl.sum(e * tl.where(keep, x, 0.0), 0)
        m = m_new
    lse = m + tl.log(s)
    tl.store(lse_ptr + row, lse)
    tl.store(ce_ptr + row, lse - tl.load(base + y).to(tl.float32))
    tl.store(ent_ptr + row, lse - t / s)
    if GRAD:
        coef = 1.0 + 2.0 * z_w * lse
        for start in range(0, vocab, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            keep = offs < vocab
            x = tl.load(base + offs, mask=keep, other=0.0).to(tl.float32)
            g = tl.exp(x - lse) * coef - tl.where(offs == y, 1.0, 0.0)
            tl.store(base + offs, g, mask=keep)


def _softmax_grad_kernel(x_ptr, stride, y_ptr, lse_ptr, g_ptr, vocab, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    base = x_ptr + row.to(tl.int64) * stride
    y = tl.load(y_ptr + row)
    lse = tl.load(lse_ptr + row).to(tl.float32)
    g = tl.load(g_ptr + row).to(tl.float32)
    for start in range(0, vocab, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        keep = offs < vocab
        x = tl.load(base + offs, mask=keep, other=0.0).to(tl.float32)
        d = g * (tl.exp(x - lse) - tl.where(offs == y, 1.0, 0.0))
        tl.store(base + offs, d, mask=keep)


def _check(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    triton_rt.require(logits.device)
    if logits.dtype != torch.float32 or logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"Triton CE rows take a row-contiguous 2-d float32 tensor, got {tuple(logits.shape)} "
                         f"{logits.dtype} strides {logits.stride()}")
    y = targets.to(torch.int64).contiguous()
    if y.shape != (logits.shape[0],):
        raise ValueError(f"targets shape {tuple(y.shape)} does not match {logits.shape[0]} logits rows")
    return y


def ce_rows_(logits: torch.Tensor, targets: torch.Tensor, z_loss_weight: float, grad: bool
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row (lse, ce, entropy) of a (c, V) fp32 logits chunk; with `grad` the chunk becomes
    d loss / d logits = softmax * (1 + 2 z lse) - onehot(target) in place. align.kernels.ce_rows.ce_rows_'s contract."""
    y = _check(logits, targets)
    rows, vocab = logits.shape
    stats = torch.empty(3, rows, dtype=torch.float32, device=logits.device)
    lse, ce, ent = stats.unbind(0)
    if rows:
        block = min(BLOCK, max(16, 1 << (vocab - 1).bit_length()))
        triton_rt.jit(_ce_rows_kernel)[(rows,)](logits, logits.stride(0), y, vocab, float(z_loss_weight),
                                                 lse, ce, ent, GRAD=bool(grad), BLOCK=block, num_warps=WARPS)
    return lse, ce, ent


def softmax_grad_rows_(logits: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor, scale: torch.Tensor) -> None:
    """In place: (c, V) fp32 logits -> scale[:, None] * (exp(logits - lse[:, None]) - onehot(targets))."""
    y = _check(logits, targets)
    rows, vocab = logits.shape
    if rows:
        block = min(BLOCK, max(16, 1 << (vocab - 1).bit_length()))
        triton_rt.jit(_softmax_grad_kernel)[(rows,)](logits, logits.stride(0), y, lse.float().contiguous(),
                                                      scale.float().contiguous(), vocab, BLOCK=block,
                                                      num_warps=WARPS)
