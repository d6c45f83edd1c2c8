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
    "align_row_dots": ([_PTR, _PTR, _I64, _I64, _I64, _I64, _I64, _PTR], ctypes.c_int),
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


def _check_rows(x: torch.Tensor, name: str) -> None:
    if x.dtype != torch.float32 or x.device.type != "cpu" or x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"{name} takes a row-contiguous 2-d float32 CPU tensor, got {tuple(x.shape)} "
                         f"{x.dtype} on {x.device} strides {x.stride()}")


def row_dots(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(R, V) x (R, V) fp32 CPU rows -> (R,) fp32 per-row dot products, rows split over torch's thread count (a
    row's bits depend only on the row)."""
    _check_rows(a, "row_dots")
    _check_rows(b, "row_dots")
    if a.shape != b.shape:
        raise ValueError(f"row_dots: shapes {tuple(a.shape)} and {tuple(b.shape)} differ")
    out = torch.empty(a.shape[0], dtype=torch.float32)
    lib().align_row_dots(a.data_ptr(), b.data_ptr(), a.shape[0], a.shape[1], a.stride(0), b.stride(0),
                         torch.get_num_threads(), out.data_ptr())
    return out


def ce_rows_(logits: torch.Tensor, targets: torch.Tensor, z_loss_weight: float, grad: bool
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row (lse, ce, entropy) of a (c, V) fp32 CPU logits chunk; with `grad`, the chunk becomes
    d loss / d logits = softmax * (1 + 2 z lse) - onehot(target) in place (else it is left untouched)."""
    _check_rows(logits, "ce_rows_")
    rows, vocab = logits.shape
    y = targets.to(torch.int64).contiguous()
    if y.shape != (rows,):
        raise ValueError(f"targets shape {tuple(y.shape)} does not match {rows} logits rows")
    stats = torch.empty(3, rows, dtype=torch.float32)
    lse, ce, ent = stats.unbind(0)
    lib().align_ce_rows(logits.data_ptr(), rows, vocab, logits.stride(0), y.data_ptr(), float(z_loss_weight),
                        int(grad), torch.get_num_threads(), lse.data_ptr(), ce.data_ptr(), ent.data_ptr())
    return lse, ce, ent
