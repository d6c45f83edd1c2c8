"""The reusable pieces of a Mistral block: RMSNorm, rotary position embedding, SwiGLU MLP.

They are plain functions and small modules so the inference engine (paged attention, flat token batches) can call
them directly. Every function here accepts any number of leading dimensions; only the last (feature) dimension and,
for RoPE, the head dimension layout matter. Numerics follow transformers' Mistral exactly, including where bf16
rounding happens (norm statistics in fp32, cast back before the weight multiply; cos/sin in fp32, cast to the
activation dtype), so that bf16 parity is a matter of kernel order, not of a different formula.

Kernels: the modules (RMSNorm, MistralMLP, and the attention's RoPE in align.model.mistral) carry a `kernel` choice,
"auto" by default (align.kernels.select): torch everywhere except on CUDA once the Triton twin
(align/kernels/triton_norm.py, triton_rope.py, triton_swiglu.py) passed its equivalence gate there; "torch" forces
these functions; `set_kernels(model, choice)` sets every module of a model. The plain functions stay torch (the
inference engine calls them directly).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from align.kernels import select, triton_norm, triton_rope, triton_swiglu


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps) in fp32, cast back to x.dtype, then times weight. x: (..., D), weight: (D,)."""
    dtype = x.dtype
    # NOTE: a hand-written expression, not F.rms_norm: F.rms_norm was no faster on CPU (torch 2.13, fwd+bwd of
    # 2048x256 fp32, equal within noise), and in bf16 it rounds differently from transformers (25% of elements).
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(dtype)


class RMSNorm(nn.Module):
    """Root-mean-square layer norm with a learned scale (`weight`, HF name), no bias."""

    kernel_name = "rms_norm"

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.kernel = "auto"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if select.resolve(self.kernel_name, self.kernel, x.device) == "triton":
            return triton_norm.rms_norm(x, self.weight, self.eps)
        return rms_norm(x, self.weight, self.eps)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


def rope_inv_freq(head_dim: int, theta: float, device=None, scaling=None) -> torch.Tensor:
    """Inverse frequencies theta^(-2i/d), i < d/2, in fp32. shape: (head_dim // 2,)

    `scaling` (align.model.hf_config.RopeScaling, rope_type "llama3"): transformers' `_compute_llama3_parameters`,
    operation for operation (fp32 tensors, Python-float factors), so the tables are its bits."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    if scaling is None:
        return inv_freq
    factor, low, high = scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor
    old_context_len = scaling.original_max_position_embeddings
    low_freq_wavelen, high_freq_wavelen = old_context_len / low, old_context_len / high
    wavelen = 2 * math.pi / inv_freq
    # shorter than high_freq_wavelen: kept; longer than low_freq_wavelen: divided by factor; between: blended
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_cos_sin(position_ids: torch.Tensor, head_dim: int, theta: float,
                 dtype: torch.dtype, scaling=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables for the given positions. position_ids: (...) int -> cos, sin: (..., head_dim) in `dtype`.

    Computed per call from the positions rather than cached: it is (tokens x head_dim) work, there is no buffer to
    shard, to move between devices or to leave uninitialised after a meta-device build, and the values are exactly
    transformers' (fp32 position * fp32 inv_freq, then cos/sin). `scaling`: see `rope_inv_freq`."""
    inv_freq = rope_inv_freq(head_dim, theta, device=position_ids.device, scaling=scaling)
    freqs = position_ids[..., None].float() * inv_freq  # (..., head_dim/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (..., head_dim): the "rotate half" layout HF checkpoints expect
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the last dimension split in halves."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kernel: str = "torch") -> torch.Tensor:
    """Rotate x: (..., T, H, Dh) token-major with cos/sin: (..., T, Dh). The head axis is broadcast.

    For a flat batch of tokens, x: (N, H, Dh) with cos/sin: (N, Dh) works the same way. `kernel`: see the module
    docstring (kernel name "rope")."""
    if kernel != "torch" and select.resolve("rope", kernel, x.device) == "triton":
        return triton_rope.apply_rope(x, cos, sin)
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # (..., T, 1, Dh): broadcast over heads
    return x * cos + rotate_half(x) * sin


class MistralMLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x)). x: (..., D) -> (..., D). HF parameter names."""

    kernel_name = "swiglu"

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.kernel = "auto"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if select.resolve(self.kernel_name, self.kernel, x.device) == "triton":
            return self.down_proj(triton_swiglu.swiglu(self.gate_proj(x), self.up_proj(x)))
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def set_kernels(model: nn.Module, kernel: str) -> int:
    """Set the kernel choice ("auto" | "torch" | "triton") of every module of `model` that has one (a class
    `kernel_name`); returns how many. The choice is resolved per forward, on the tensors' device."""
    if kernel not in select.CHOICES:
        raise ValueError(f"kernel must be one of {select.CHOICES}, got {kernel!r}")
    mods = [m for m in model.modules() if getattr(type(m), "kernel_name", None)]
    for m in mods:
        m.kernel = kernel
    return len(mods)
