"""OLMoE decoder in plain torch, with transformers' module and parameter names (`OlmoeForCausalLM`).

OLMoE is the Mistral trunk with two changes, and this module is exactly those two on top of align.model.mistral:
- QK-norm: an RMSNorm over the full q and k projections (q_norm over H*Dh, k_norm over KVH*Dh) before the heads
  are split and RoPE is applied (`OlmoeAttention.project`; the inference engine calls `qkv`, so it gets it too);
- a sparse MoE block (align.model.moe.SparseMoeBlock) in place of the dense MLP, named `mlp` with `mlp.gate.weight`
  and the fused `mlp.experts.gate_up_proj` / `mlp.experts.down_proj`, as transformers 5 names them.

The model adds no loss: `forward(..., return_router_stats=True)` also returns `RouterStats` over the real tokens
(attention_mask), from which align.train.moe_module builds the auxiliary losses. Each `OlmoeDecoderLayer` takes
and returns tensors only (hidden, router logits), the FSDP2 / activation-checkpoint unit.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from align.model.attention import AttentionConfig, KVCache
from align.model.hf_config import MistralConfig
from align.model.layers import RMSNorm
from align.model.mistral import MistralAttention, MistralModel, _CausalLM
from align.model.moe import BACKENDS, ROUTER_DTYPES, Experts, Router, RouterDtype, RouterStats, SparseMoeBlock


@dataclass(frozen=True)
class OlmoeConfig(MistralConfig):
    """Architecture of an OLMoE decoder: the Mistral fields (HF names) plus the expert layout.

    Defaults are a tiny CPU shape; `intermediate_size` is each expert's hidden size."""

    vocab_size: int = 50304
    intermediate_size: int = 128
    num_key_value_heads: int = 8
    rope_theta: float = 10000.0
    pad_token_id: int | None = 1
    bos_token_id: int | None = None
    eos_token_id: int | None = 50279
    num_experts: int = 8
    num_experts_per_tok: int = 2
    norm_topk_prob: bool = False
    router_aux_loss_coef: float = 0.01  # recorded for transformers' own loss; align's coefficients are stage config

    def __post_init__(self):
        super().__post_init__()
        problems = []
        if self.sliding_window is not None:
            problems.append(f"sliding_window must be None for OLMoE, got {self.sliding_window}")
        if self.head_dim * self.num_attention_heads != self.hidden_size:
            # transformers sizes q_norm by hidden_size and k_norm by (hidden_size // heads) * kv_heads
            problems.append(f"head_dim ({self.head_dim}) x num_attention_heads ({self.num_attention_heads}) must "
                            f"equal hidden_size ({self.hidden_size})")
        if self.num_experts <= 0:
            problems.append(f"num_experts must be > 0, got {self.num_experts}")
        if not 1 <= self.num_experts_per_tok <= self.num_experts:
            problems.append(f"num_experts_per_tok must be in [1, num_experts={self.num_experts}], "
                            f"got {self.num_experts_per_tok}")
        if problems:
            raise ValueError("OlmoeConfig: " + "; ".join(problems))


@dataclass(frozen=True)
class ExpertLayout:
    """A stage's [model.moe] table: turns a dense [model.init] shape into an OLMoE one (intermediate_size becomes
    each expert's hidden size).

    `router_dtype` is a training option, not architecture: it is set on the built model's routers
    (`set_router_dtype`), never written to config.json (which holds transformers' fields only), so a checkpoint
    loads as "activation" and a stage that wants "fp32" says so again."""

    num_experts: int = 8
    num_experts_per_tok: int = 2
    norm_topk_prob: bool = False
    router_dtype: RouterDtype = "activation"


def olmoe_config(dense: MistralConfig, layout: ExpertLayout) -> OlmoeConfig:
    arch = {k: v for k, v in dataclasses.asdict(layout).items() if k != "router_dtype"}
    return OlmoeConfig(**dataclasses.asdict(dense), **arch)


def olmoe_from_layout(dense: MistralConfig, layout: ExpertLayout) -> "OlmoeForCausalLM":
    """A freshly initialised OLMoE of a [model.init] shape and a [model.moe] table (router_dtype applied)."""
    model = OlmoeForCausalLM(olmoe_config(dense, layout))
    set_router_dtype(model, layout.router_dtype)
    return model


class OlmoeAttention(MistralAttention):
    """Mistral attention with QK-norm over the full projections (transformers' q_norm / k_norm)."""

    qk_norm = "projection"

    def __init__(self, cfg: OlmoeConfig, layer_idx: int, attn: AttentionConfig):
        super().__init__(cfg, layer_idx, attn)
        self.q_norm = RMSNorm(cfg.num_attention_heads * cfg.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(cfg.num_key_value_heads * cfg.head_dim, cfg.rms_norm_eps)

    def project(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.q_norm(self.q_proj(hidden)), self.k_norm(self.k_proj(hidden)), self.v_proj(hidden)


class OlmoeDecoderLayer(nn.Module):
    """Pre-norm block: h + attn(norm(h)), then h + moe(norm(h)). forward -> (hidden, router logits (B*T, E))."""

    def __init__(self, cfg: OlmoeConfig, layer_idx: int, attn: AttentionConfig):
        super().__init__()
        self.self_attn = OlmoeAttention(cfg, layer_idx, attn)
        self.mlp = SparseMoeBlock(cfg.hidden_size, cfg.intermediate_size, cfg.num_experts, cfg.num_experts_per_tok,
                                  cfg.norm_topk_prob)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, hidden: torch.Tensor, rope, mask: torch.Tensor | None = None, cache: KVCache | None = None,
                cache_step=None) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), rope, mask, cache, cache_step)
        moe_out, router_logits = self.mlp(self.post_attention_layernorm(hidden))
        return hidden + moe_out, router_logits


class OlmoeModel(MistralModel):
    """Embedding, OLMoE layers, final norm. forward -> (final-normed hidden (B, T, D), per-layer router logits)."""

    layer_cls = OlmoeDecoderLayer

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, kv_cache: KVCache | None = None,
                document_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        hidden, rope, mask, step = self.prepare(input_ids, attention_mask, position_ids, kv_cache, document_ids)
        router_logits = []
        for layer in self.layers:
            hidden, logits = layer(hidden, rope, mask, kv_cache, step)
            router_logits.append(logits)
        if kv_cache is not None:
            kv_cache.commit(step)
        return self.norm(hidden), router_logits


class OlmoeForCausalLM(_CausalLM):
    """The MoE policy/reference model. forward -> logits (B, T, V), or (logits, RouterStats) when asked."""

    hf_architecture = "OlmoeForCausalLM"
    trunk_cls = OlmoeModel

    def __init__(self, cfg: OlmoeConfig, attn: AttentionConfig | None = None, init: bool = True):
        if not isinstance(cfg, OlmoeConfig):
            raise TypeError(f"OlmoeForCausalLM needs an OlmoeConfig, got {type(cfg).__name__}")
        super().__init__(cfg, attn, init)

    def forward_hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                       position_ids: torch.Tensor | None = None, kv_cache: KVCache | None = None,
                       document_ids: torch.Tensor | None = None, return_router_stats: bool = False):
        """Final-normed hidden (B, T, D); with return_router_stats, also RouterStats over the tokens where
        attention_mask is True (all tokens without a mask)."""
        hidden, router_logits = self.model(input_ids, attention_mask, position_ids, kv_cache, document_ids)
        if not return_router_stats:
            return hidden
        mask = None if attention_mask is None else attention_mask.reshape(-1)
        return hidden, RouterStats.from_logits(router_logits, self.config.num_experts_per_tok, mask)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, kv_cache: KVCache | None = None,
                document_ids: torch.Tensor | None = None, return_router_stats: bool = False):
        out = self.forward_hidden(input_ids, attention_mask, position_ids, kv_cache, document_ids,
                                  return_router_stats)
        if return_router_stats:
            return self.lm_head(out[0]), out[1]
        return self.lm_head(out)


def set_expert_backend(model: nn.Module, backend: str) -> None:
    """Switch every expert block of `model` to the 'loop' or 'grouped' backend (same function, other kernels)."""
    if backend not in BACKENDS:
        raise ValueError(f"expert backend must be one of {BACKENDS}, got {backend!r}")
    for module in model.modules():
        if isinstance(module, Experts):
            module.backend = backend


def set_router_dtype(model: nn.Module, router_dtype: str) -> None:
    """Compute every router's logits of `model` in "activation" dtype (transformers') or "fp32" (OLMo-core's)."""
    if router_dtype not in ROUTER_DTYPES:
        raise ValueError(f"router_dtype must be one of {ROUTER_DTYPES}, got {router_dtype!r}")
    for module in model.modules():
        if isinstance(module, Router):
            module.router_dtype = router_dtype
