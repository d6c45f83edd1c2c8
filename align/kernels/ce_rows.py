"""ctypes wrapper of align/kernels/csrc/ce_rows.c: the fused CE head's per-row passes over a logits chunk on a CPU
(max, exp-sum, entropy dot, and the logits gradient written in place), used by align.kernels.fused_ce when its
`kernel` is "native" (or "auto" on a CPU where the C build works). Why: csrc/ce_rows.c's header."""

from __future__ import annotations

import ctypes

import torch

from align.kernels import native

_I64, _PTR = native.I64, native.PTR
SIGNATURES: native.Signatures = {
    "align_ce_rows": ([_PTR, _I64, _I64, _I64, _PTR, native.F32, _I64, _I64, _PTR, _PTR, _PTR], ctypes.c_int),
}


def lib() -> ctypes.CDLL:
    """csrc/ce_rows.c, built on first use (raises native.NativeUnavailable where it cannot be)."""
    return native.load("ce_rows", SIGNATURES)


def available() -> bool:
    """Whether the C kernel builds and loads on this machine (the reason is kept by align.kernels.native)."""
    try:
        lib()
    except native.NativeUnavailable:
        return False
    return True


def ce_rows_(logits: torch.Tensor, targets: torch.Tensor, z_loss_weight: float, grad: bool
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row (lse, ce, entropy) of a (c, V) fp32 CPU logits chunk; with `grad`, the chunk becomes
    d loss / d logits = softmax * (1 + 2 z lse) - onehot(target) in place (else it is left untouched)."""
    if logits.dtype != torch.float32 or logits.device.type != "cpu" or logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"ce_rows_ takes a row-contiguous 2-d float32 CPU tensor, got {tuple(logits.shape)} "
                         f"{logits.dtype} on {logits.device} strides {logits.stride()}")
    rows, vocab = logits.shape
    y = targets.to(torch.int64).contiguous()
    if y.shape != (rows,):
        raise ValueError(f"targets shape {tuple(y.shape)} does not match {rows} logits rows")
    stats = torch.empty(3, rows, dtype=torch.float32)
    lse, ce, ent = stats.unbind(0)
    lib().align_ce_rows(logits.data_ptr(), rows, vocab, logits.stride(0), y.data_ptr(), float(z_loss_weight),
                        int(grad), torch.get_num_threads(), lse.data_ptr(), ce.data_ptr(), ent.data_ptr())
    return lse, ce, ent
