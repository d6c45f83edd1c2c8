"""Attention for the training/scoring path: an SDPA path, an eager reference path, masks, and a small KV cache.

Layout: q (B, H, Tq, Dh), k and v (B, KVH, Tk, Dh) with H a multiple of KVH (grouped-query attention).
A mask is a bool tensor broadcastable to (B, 1, Tq, Tk), True = may attend. `mask=None` means plain causal
attention over a square score matrix (Tq == Tk): the fast path, no mask tensor is built and SDPA runs with
`is_causal=True`.

Packed rows (several documents per row): `document_mask` builds the block-diagonal causal mask and
`document_positions` the positions that restart at each document; nothing here is built for an unpacked batch.

A query row whose keys are all masked (a left-padding position) outputs zeros in both paths, never NaN, so a
padding position cannot poison the gradient of the real ones.

The KV cache here is the contiguous reference one (per-sequence lengths, sequences of a batch at different
lengths); the inference engine brings its own paged attention and calls `MistralAttention.qkv` directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


@dataclass(frozen=True)
class AttentionConfig:
    """How attention is computed. Not part of the HF config: it changes kernels, not the function."""

    impl: Literal["sdpa", "eager"] = "sdpa"  # eager: explicit softmax(QK^T)V, the readable reference
    # deterministic: restrict SDPA to the math backend, whose backward has no atomics (the flash and
    # memory-efficient CUDA kernels accumulate dq/dk with atomics, so two identical steps can differ).
    deterministic: bool = False


# GQA inside SDPA (enable_gqa) instead of materialising repeated K/V heads. Measured on CPU, 1 thread, fp32,
# B=8 H=8 KVH=2 T=256 Dh=32, causal fwd+bwd: 30.0-30.8 ms native vs 33.3-35.3 ms expand+reshape (MEASUREMENTS.md).
NATIVE_GQA = True


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """(B, KVH, T, Dh) -> (B, KVH * groups, T, Dh), each kv head repeated for its query group."""
    if groups == 1:
        return x
    b, kvh, t, d = x.shape
    return x[:, :, None].expand(b, kvh, groups, t, d).reshape(b, kvh * groups, t, d)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
              cfg: AttentionConfig = AttentionConfig()) -> torch.Tensor:
    """softmax(q k^T / sqrt(Dh) + mask) v. q: (B,H,Tq,Dh), k/v: (B,KVH,Tk,Dh) -> (B,H,Tq,Dh)."""
    if mask is None and q.shape[-2] != k.shape[-2]:
        raise ValueError(f"mask=None means square causal attention, got Tq={q.shape[-2]} Tk={k.shape[-2]}")
    if cfg.impl == "eager":
        return eager_attention(q, k, v, mask)
    if cfg.impl != "sdpa":
        raise ValueError(f"AttentionConfig.impl must be 'sdpa' or 'eager', got {cfg.impl!r}")
    if cfg.deterministic:
        with sdpa_kernel([SDPBackend.MATH]):
            return _sdpa(q, k, v, mask)
    return _sdpa(q, k, v, mask)


def _sdpa(q, k, v, mask):
    groups = q.shape[1] // k.shape[1]
    if not NATIVE_GQA:
        k, v = repeat_kv(k, groups), repeat_kv(v, groups)
    gqa = NATIVE_GQA and groups > 1
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The textbook computation, softmax in fp32. Same shapes as `attention`."""
    groups = q.shape[1] // k.shape[1]
    k, v = repeat_kv(k, groups), repeat_kv(v, groups)
    scores = torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5  # (B, H, Tq, Tk)
    if mask is None:
        mask = causal_mask(q.shape[-2], q.device)
    # finfo.min, not -inf: a fully masked row then softmaxes to finite values that `any_key` zeroes below.
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    any_key = mask.any(dim=-1, keepdim=True)  # (B or 1, 1, Tq, 1)
    return torch.matmul(probs * any_key, v)


def causal_mask(t: int, device=None) -> torch.Tensor:
    """(1, 1, T, T) bool lower-triangular."""
    return torch.ones(t, t, dtype=torch.bool, device=device).tril()[None, None]


def build_mask(attention_mask: torch.Tensor | None, seq_len: int, sliding_window: int | None) -> torch.Tensor | None:
    """Mask for a forward without a cache. attention_mask: (B, T) bool, True = real token.

    Returns None (the causal fast path) when nothing is padded and the window does not bite."""
    window_bites = sliding_window is not None and sliding_window < seq_len
    if attention_mask is not None and bool(attention_mask.all()):
        attention_mask = None  # NOTE: a host sync on GPU; it buys the no-mask SDPA kernel for unpadded batches
    if attention_mask is None and not window_bites:
        return None
    mask = _causal(seq_len, sliding_window, attention_mask.device if attention_mask is not None else None)
    mask = mask[None, None]  # (1, 1, T, T)
    if attention_mask is not None:
        mask = mask & attention_mask.bool()[:, None, None, :]  # (B, 1, T, T)
    return mask


def _causal(seq_len: int, sliding_window: int | None, device) -> torch.Tensor:
    """(T, T) bool: key at or before the query, and inside the window when one is set."""
    pos = torch.arange(seq_len, device=device)
    mask = pos[None, :] <= pos[:, None]  # (Tq, Tk) causal
    if sliding_window is not None and sliding_window < seq_len:
        mask = mask & (pos[None, :] > pos[:, None] - sliding_window)  # HF: kv_idx > q_idx - window
    return mask


def document_mask(document_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                  sliding_window: int | None) -> torch.Tensor:
    """Block-diagonal causal mask of packed rows: (B, T) document index per token -> (B, 1, T, T) bool.

    A query sees the keys at or before it in its own document (and window), never another document's. Keys where
    `attention_mask` is False (padding) are hidden, but every query keeps its own key: a padding query would
    otherwise have no key at all, and some fused GPU kernels return NaN (not 0) for a fully masked row."""
    b, t = document_ids.shape
    mask = _causal(t, sliding_window, document_ids.device)[None]  # (1, T, T)
    mask = mask & (document_ids[:, :, None] == document_ids[:, None, :])  # (B, T, T)
    if attention_mask is not None:
        own = torch.eye(t, dtype=torch.bool, device=document_ids.device)[None]
        mask = mask & (attention_mask.bool()[:, None, :] | own)
    return mask[:, None]  # (B, 1, T, T)


def document_positions(document_ids: torch.Tensor) -> torch.Tensor:
    """(B, T) int64 position of each token inside its document: 0 at every document's first token (RoPE restarts,
    so a packed document is rotated exactly as it would be alone). Documents are contiguous runs of one id."""
    t = document_ids.shape[1]
    idx = torch.arange(t, device=document_ids.device).expand_as(document_ids)
    first = torch.ones_like(document_ids, dtype=torch.bool)
    first[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
    return idx - torch.where(first, idx, torch.zeros_like(idx)).cummax(dim=1).values


@dataclass(frozen=True)
class CacheStep:
    """Where one forward's new tokens go in the cache. Built once per forward, shared by all layers."""

    positions: torch.Tensor  # (B, T) int64: RoPE positions of the new tokens (= their slot)
    slots: torch.Tensor  # (B, T) int64: slot per new token; padding tokens go to the trash slot
    mask: torch.Tensor  # (B, 1, T, S + 1) bool
    new_lengths: torch.Tensor  # (B,) int64


class KVCache:
    """Contiguous K/V storage for incremental decoding, one row per sequence, each with its own length.

    Storage per layer: (B, S + 1, KVH, Dh), token-major; slot S is a trash slot that padded new tokens write to
    and no query ever reads, so a batch whose sequences add different numbers of tokens needs no Python loop."""

    def __init__(self, num_layers: int, batch_size: int, max_len: int, num_kv_heads: int, head_dim: int,
                 sliding_window: int | None = None, dtype=torch.float32, device=None):
        shape = (batch_size, max_len + 1, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.lengths = torch.zeros(batch_size, dtype=torch.int64, device=device)
        self.max_len = max_len
        self.sliding_window = sliding_window

    def plan(self, new_mask: torch.Tensor) -> CacheStep:
        """new_mask: (B, T) bool, True for real new tokens; each row's real tokens must come first."""
        b, t = new_mask.shape
        steps = torch.arange(t, device=new_mask.device)
        n_new = new_mask.sum(dim=1)
        if not torch.equal(new_mask.bool(), steps[None, :] < n_new[:, None]):
            raise ValueError("KVCache: new tokens must be right-padded (real tokens first in every row)")
        new_lengths = self.lengths + n_new
        if int(new_lengths.max()) > self.max_len:
            raise ValueError(f"KVCache: {int(new_lengths.max())} tokens exceed max_len={self.max_len}")
        positions = self.lengths[:, None] + steps[None, :]  # (B, T)
        slots = torch.where(new_mask.bool(), positions, torch.full_like(positions, self.max_len))
        kv_idx = torch.arange(self.max_len + 1, device=new_mask.device)[None, None, :]  # (1, 1, S+1)
        mask = (kv_idx <= positions[:, :, None]) & (kv_idx < new_lengths[:, None, None])  # (B, T, S+1)
        if self.sliding_window is not None:
            mask = mask & (kv_idx > positions[:, :, None] - self.sliding_window)
        return CacheStep(positions, slots, mask[:, None], new_lengths)

    def write(self, layer: int, step: CacheStep, k_new: torch.Tensor,
              v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k_new/v_new (B, T, KVH, Dh) at their slots; return this layer's k, v as (B, KVH, S+1, Dh)."""
        rows = torch.arange(k_new.shape[0], device=k_new.device)[:, None].expand_as(step.slots)
        self.k[layer][rows, step.slots] = k_new.to(self.k[layer].dtype)
        self.v[layer][rows, step.slots] = v_new.to(self.v[layer].dtype)
        return self.k[layer].transpose(1, 2), self.v[layer].transpose(1, 2)

    def commit(self, step: CacheStep) -> None:
        """Advance every sequence's length once all layers have written this step."""
        self.lengths = step.new_lengths
