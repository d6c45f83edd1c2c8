"""Which kernel runs the engine's decode products, and the oneDNN packed-weight calls: "native" (align's C kernel,
fp32 on a CPU), "onednn" (prepacked weights, fp32/bf16 on a CPU), "torch" (`F.linear`)."""

from __future__ import annotations

import torch

from align.inference.config import LINEAR_KERNELS
from align.kernels import linear as native_linear
from align.kernels import native

PACK_ROWS_HINT = 16  # oneDNN's batch-size hint when packing (AMD EPYC: invariant rows for m >= 2 with it; 1 is worse)


def onednn_can_run(weight: torch.Tensor) -> bool:
    """oneDNN on a CPU, fp32 anywhere it is built, bf16 only where its bf16 path runs (AVX-512 BW/VL/DQ or
    AVX-NE-CONVERT: on an AVX2-only host the weight reorder raises)."""
    if weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if weight.dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return weight.dtype == torch.float32


def native_unsupported(weight: torch.Tensor) -> str | None:
    """Why the native C kernel cannot multiply by weights like `weight` (None: it can)."""
    if weight.device.type != "cpu" or weight.dtype != torch.float32:
        return f"it takes float32 weights on a CPU, the model is {weight.dtype} on {weight.device}"
    try:
        native_linear.lib()
    except native.NativeUnavailable as err:
        return str(err)
    return None


def resolve_linear_kernel(kernel: str, weight: torch.Tensor) -> str:
    """The kernel to run on weights like `weight`: "auto" -> "native" for fp32 on a CPU where it builds, else
    "onednn" where it can run (bf16 on a CPU), else "torch". Raises if an explicit choice cannot run."""
    if kernel not in LINEAR_KERNELS:
        raise ValueError(f"EngineConfig.linear_kernel must be one of {LINEAR_KERNELS}, got {kernel!r}")
    if kernel == "auto":
        if native_unsupported(weight) is None:
            return "native"
        return "onednn" if onednn_can_run(weight) else "torch"
    if kernel == "native":
        why = native_unsupported(weight)
        if why is not None:
            raise ValueError(f"linear_kernel 'native' cannot run here: {why}")
    if kernel == "onednn" and not onednn_can_run(weight):
        raise ValueError(f"linear_kernel 'onednn' needs float32 or bfloat16 weights on a CPU and a torch built with "
                         f"oneDNN (bf16: a CPU with oneDNN's bf16 path); the model is {weight.dtype} on "
                         f"{weight.device} (mkldnn available: {torch.backends.mkldnn.is_available()}, bf16 "
                         f"supported: {bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())})")
    return kernel


def onednn_pack(w: torch.Tensor) -> torch.Tensor:
    """w (out, in) -> oneDNN's packed copy for `onednn_linear`."""
    return torch.ops.mkldnn._reorder_linear_weight(w.detach().contiguous(), PACK_ROWS_HINT)


def onednn_linear(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """x (N, in) @ w.T on a weight made by `onednn_pack`."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
