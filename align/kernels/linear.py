"""ctypes wrapper of align/kernels/csrc/linear.c: fp32 `x @ W^T (+ residual)` on weights packed once into 16-column
panels, the engine's "native" linear kernel on a CPU (fused_layers.py). Why a kernel of our own: the decode step's
small-M products on cold weights, where oneDNN and MKL read the weights at a fraction of the core's bandwidth
(bench/linear_kernels.py); every output is one FMA chain over k in order, so a row's result never depends on the
rows beside it."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from align.kernels import native

_I64, _PTR = native.I64, native.PTR
SIGNATURES: native.Signatures = {
    "align_linear_pack": ([_PTR, _I64, _I64, _PTR], None),
    "align_linear": ([_PTR, _I64, _I64, _I64, _PTR, _I64, _PTR, _I64, _PTR, _I64, _I64, _PTR, native.F32, _I64],
                     ctypes.c_int),
}
_RMSNORM, _SWIGLU = 1, 2  # csrc/linear.c's prologues


@dataclass(frozen=True)
class PackedWeight:
    panels: torch.Tensor  # (ceil(out / 16) * in * 16,) fp32: (panel, k, 16 columns), columns past `out` zero
    out_features: int
    in_features: int


def lib() -> ctypes.CDLL:
    """csrc/linear.c, built on first use (raises native.NativeUnavailable where it cannot be)."""
    return native.load("linear", SIGNATURES)


def pack(w: torch.Tensor) -> PackedWeight:
    """w (out, in) fp32 on CPU -> its panel copy."""
    if w.dtype != torch.float32 or w.device.type != "cpu" or w.dim() != 2:
        raise ValueError(f"the native linear kernel packs 2-d float32 CPU weights, got {tuple(w.shape)} "
                         f"{w.dtype} on {w.device}")
    w = w.detach().contiguous()
    n, k = w.shape
    panels = torch.empty(-(-n // 16) * k * 16, dtype=torch.float32)
    lib().align_linear_pack(w.data_ptr(), n, k, panels.data_ptr())
    return PackedWeight(panels, n, k)


def linear(x: torch.Tensor, w: PackedWeight, residual: torch.Tensor | None = None,
           out: torch.Tensor | None = None, rms_norm: tuple[torch.Tensor, float] | None = None,
           swiglu: bool = False) -> torch.Tensor:
    """x (M, in) @ W^T (+ residual (M, out)) -> (M, out) fp32, written into `out` when given.

    rms_norm=(weight (in,), eps): the rows are RMS-normed first, x * weight / sqrt(mean(x^2) + eps).
    swiglu: x is (M, 2 * in), gate and up side by side, and the rows multiplied are silu(gate) * up.
    Both are applied in the copy of x the kernel makes anyway (csrc/linear.c), not as passes of their own."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    m, k = x.shape
    width = 2 * w.in_features if swiglu else w.in_features
    if k != width or x.dtype != torch.float32:
        raise ValueError(f"x is {tuple(x.shape)} {x.dtype}; the weight takes float32 rows of {width}")
    if swiglu and rms_norm is not None:
        raise ValueError("one prologue per product: rms_norm or swiglu, not both")
    y = torch.empty((m, w.out_features), dtype=torch.float32) if out is None else out
    assert y.shape == (m, w.out_features) and y.stride(-1) == 1
    if residual is not None:
        residual = residual if residual.stride(-1) == 1 else residual.contiguous()
        assert residual.shape == y.shape and residual.dtype == torch.float32
    prologue, pw, eps = 0, None, 0.0
    if rms_norm is not None:
        weight, eps = rms_norm
        assert weight.shape == (w.in_features,) and weight.dtype == torch.float32 and weight.is_contiguous()
        prologue, pw = _RMSNORM, weight.data_ptr()
    elif swiglu:
        prologue = _SWIGLU
    rc = lib().align_linear(x.data_ptr(), m, w.in_features, x.stride(0), w.panels.data_ptr(), w.out_features,
                            y.data_ptr(), y.stride(0), None if residual is None else residual.data_ptr(),
                            0 if residual is None else residual.stride(0), prologue, pw, float(eps),
                            max(1, torch.get_num_threads()))
    if rc == -2:
        raise MemoryError(f"native linear: no memory for a copy of x {tuple(x.shape)}")
    return y
