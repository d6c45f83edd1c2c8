"""The decoder layer the engine runs per step, with fused projection weights.

A decode step is a handful of small matmuls per layer; on CPU each one pays a fixed dispatch and thread fork/join
cost that, at 16 rows, is comparable to the arithmetic. So q/k/v become one matmul against their concatenated
weights, gate/up another, RoPE rotates q and k in one call, and fp32 RMSNorm is torch's single-kernel `rms_norm`
(bit-identical to the model's fp32 expression; in other dtypes the model's own norm runs, for its rounding order).
The math is the model's: the same weights, `apply_rope`, SiLU-gated MLP, residuals.

The fused tensors are copies, so they must follow the model's weights. Every in-place write to a tensor bumps its
version counter; `refresh()` compares the counters (and storage pointers) of the source parameters with those seen
when the copies were made and rebuilds what changed. So an engine sharing its model with a trainer cannot serve
stale weights, whether or not `load_weights` was called."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from align.model.layers import apply_rope


@dataclass
class _Fused:
    wqkv: torch.Tensor  # (H*Dh + 2*KVH*Dh, D)
    wgu: torch.Tensor  # (2*F, D)
    stamp: tuple  # (version, data_ptr) of every source weight when built


def _sources(layer) -> tuple[torch.Tensor, ...]:
    a, m = layer.self_attn, layer.mlp
    return (a.q_proj.weight, a.k_proj.weight, a.v_proj.weight, m.gate_proj.weight, m.up_proj.weight)


def _stamp(tensors) -> tuple:
    return tuple((t._version, t.data_ptr()) for t in tensors)


class FusedDecoder:
    def __init__(self, model: torch.nn.Module):
        self.layers = model.model.layers
        cfg = model.config
        self.q_dim = cfg.num_attention_heads * cfg.head_dim
        self.kv_dim = cfg.num_key_value_heads * cfg.head_dim
        self.ffn = cfg.intermediate_size
        self.heads = cfg.num_attention_heads + cfg.num_key_value_heads  # rotated heads: q and k together
        self.head_dim = cfg.head_dim
        self.fused: list[_Fused | None] = [None] * len(self.layers)
        self.refresh()

    @torch.no_grad()
    def refresh(self) -> int:
        """Rebuild the fused copies of layers whose weights changed since they were made; returns how many."""
        rebuilt = 0
        for i, layer in enumerate(self.layers):
            src = _sources(layer)
            if self.fused[i] is None or self.fused[i].stamp != _stamp(src):
                self.fused[i] = _Fused(torch.cat(src[:3]), torch.cat(src[3:]), _stamp(src))
                rebuilt += 1
        return rebuilt

    @staticmethod
    def norm(module, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return F.rms_norm(x, module.weight.shape, module.weight, module.eps)
        return module(x)

    def qkv(self, i: int, hidden: torch.Tensor, rope) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """hidden (N, D) -> q (N, H, Dh), k (N, KVH, Dh), v (N, KVH, Dh); RoPE applied to q and k."""
        layer = self.layers[i]
        out = F.linear(self.norm(layer.input_layernorm, hidden), self.fused[i].wqkv)  # (N, q + 2 kv)
        n = hidden.shape[0]
        qk = apply_rope(out[:, :self.q_dim + self.kv_dim].view(n, self.heads, self.head_dim), *rope)
        q, k = qk.split((self.q_dim // self.head_dim, self.kv_dim // self.head_dim), dim=1)
        return q, k, out[:, self.q_dim + self.kv_dim:].view(n, -1, self.head_dim)

    def mlp(self, i: int, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (N, D) -> hidden + mlp(norm(hidden))."""
        layer = self.layers[i]
        gu = F.linear(self.norm(layer.post_attention_layernorm, hidden), self.fused[i].wgu)  # (N, 2F)
        return hidden + layer.mlp.down_proj(F.silu(gu[:, :self.ffn]) * gu[:, self.ffn:])
