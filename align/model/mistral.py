"""Mistral decoder in plain torch, with transformers' module and parameter names.

`MistralForCausalLM` (policy / reference), `MistralForValueHead` (critic: one value per token) and
`MistralForProcessReward` (per-token scores) share the trunk `MistralModel`. Parameter names are exactly the HF
ones (`model.layers.3.self_attn.q_proj.weight`, ...), so the state dict is the checkpoint's key table with no
mapping. The heads use the layouts of transformers' `MistralForSequenceClassification` (`score`, no bias) and
`MistralForTokenClassification` (`score` with bias), so their checkpoints load there too.

Each `MistralDecoderLayer` is self-contained (its forward takes tensors only), the unit FSDP2's `fully_shard`
and activation checkpointing wrap. Nothing is a buffer: RoPE tables are computed from the positions per forward,
so a model built on the meta device and materialised with `to_empty` has no uninitialised state beyond its
parameters, which `init_weights` (or a checkpoint load) fills.
"""

from __future__ import annotations

import torch
from torch import nn

from align.model.attention import (AttentionConfig, KVCache, attention, build_mask, document_mask,
                                   document_positions)
from align.model.hf_config import MistralConfig
from align.model.layers import MistralMLP, RMSNorm, apply_rope, rope_cos_sin

Rope = tuple[torch.Tensor, torch.Tensor]


class MistralAttention(nn.Module):
    """Grouped-query self-attention with RoPE. Projections named as in HF (q_proj, k_proj, v_proj, o_proj)."""

    kernel_name = "rope"  # the rotation's kernel choice (align.model.layers.set_kernels)

    def __init__(self, cfg: MistralConfig, layer_idx: int, attn: AttentionConfig):
        super().__init__()
        self.kernel = "auto"
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.rope_theta = cfg.rope_theta
        self.attn = attn
        self.rope_scaling = cfg.rope_scaling  # Llama 3's scaled frequencies; None: plain RoPE
        d, bias = cfg.hidden_size, cfg.qkv_bias  # Qwen 2: biases on q, k and v (never on o)
        self.q_proj = nn.Linear(d, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(d, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, d, bias=False)
        if cfg.qk_norm == "head":  # Qwen 3: each head's q and k RMS-normed (weights of head_dim) before RoPE
            self.qk_norm = "head"
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)

    # None, "head" (per-head q_norm / k_norm after the heads are split) or "projection" (OLMoE: over the full
    # projections, in `project`): what the inference engine applies between the q/k/v product and RoPE.
    qk_norm: str | None = None

    def rope(self, position_ids: torch.Tensor, dtype: torch.dtype) -> Rope:
        """cos, sin for these positions: position_ids (...) -> (..., head_dim) each."""
        return rope_cos_sin(position_ids, self.head_dim, self.rope_theta, dtype, self.rope_scaling)

    def qkv(self, hidden: torch.Tensor, position_ids: torch.Tensor | None = None,
            rope: Rope | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Project and rotate. Token-major, any leading dims (a (B, T) batch or a flat (N,) token list):

        hidden (..., D), position_ids (...) int  ->  q (..., H, Dh), k (..., KVH, Dh), v (..., KVH, Dh),
        RoPE applied to q and k. Pass `rope` (from `self.rope`) instead of position_ids to reuse tables."""
        if rope is None:
            if position_ids is None:
                raise ValueError("qkv needs position_ids or precomputed rope tables")
            rope = self.rope(position_ids, hidden.dtype)
        cos, sin = rope
        q, k, v = self.project(hidden)
        q = q.unflatten(-1, (self.num_heads, self.head_dim))
        k = k.unflatten(-1, (self.num_kv_heads, self.head_dim))
        v = v.unflatten(-1, (self.num_kv_heads, self.head_dim))
        if self.qk_norm == "head":
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q, cos, sin, self.kernel), apply_rope(k, cos, sin, self.kernel), v

    def project(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The flat q, k, v projections (..., H*Dh | KVH*Dh) before RoPE (and before a per-head QK-norm); OLMoE
        overrides this with its norm over the full projections."""
        return self.q_proj(hidden), self.k_proj(hidden), self.v_proj(hidden)

    def forward(self, hidden: torch.Tensor, rope: Rope, mask: torch.Tensor | None = None,
                cache: KVCache | None = None, cache_step=None) -> torch.Tensor:
        """hidden (B, T, D) -> (B, T, D). mask: see align.model.attention (None = plain causal)."""
        q, k, v = self.qkv(hidden, rope=rope)  # (B, T, H|KVH, Dh)
        if cache is not None:
            k, v = cache.write(self.layer_idx, cache_step, k, v)  # (B, KVH, S+1, Dh)
        else:
            k, v = k.transpose(1, 2), v.transpose(1, 2)  # (B, KVH, T, Dh)
        out = attention(q.transpose(1, 2), k, v, mask, self.attn)  # (B, H, T, Dh)
        return self.o_proj(out.transpose(1, 2).flatten(2))  # (B, T, H*Dh) -> (B, T, D)


class MistralDecoderLayer(nn.Module):
    """Pre-norm block: h + attn(norm(h)), then h + mlp(norm(h)). The FSDP / activation-checkpoint unit."""

    def __init__(self, cfg: MistralConfig, layer_idx: int, attn: AttentionConfig):
        super().__init__()
        self.self_attn = MistralAttention(cfg, layer_idx, attn)
        self.mlp = MistralMLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, hidden: torch.Tensor, rope: Rope, mask: torch.Tensor | None = None,
                cache: KVCache | None = None, cache_step=None) -> torch.Tensor:
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), rope, mask, cache, cache_step)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class MistralModel(nn.Module):
    """Embedding, decoder layers, final norm. forward returns final-normed hidden states (B, T, D)."""

    layer_cls = MistralDecoderLayer  # a family with another block (align.model.olmoe) swaps the class

    def __init__(self, cfg: MistralConfig, attn: AttentionConfig = AttentionConfig()):
        super().__init__()
        self.config = cfg
        self.embed_tokens = _embedding(cfg.vocab_size, cfg.hidden_size, cfg.pad_token_id)
        self.layers = nn.ModuleList(self.layer_cls(cfg, i, attn) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, kv_cache: KVCache | None = None,
                document_ids: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids (B, T); attention_mask (B, T) bool True = token; position_ids (B, T) or None.

        Without a cache, position_ids default to 0..T-1 (as transformers; left-padded callers pass their own).
        With a cache, the new tokens follow each sequence's cached length and attention_mask marks which of the
        T new tokens are real (right-padded). document_ids (B, T) int: packed rows (align.data.collate_packed);
        attention stays inside each document and position_ids default to positions restarting per document."""
        hidden, rope, mask, step = self.prepare(input_ids, attention_mask, position_ids, kv_cache, document_ids)
        for layer in self.layers:
            hidden = layer(hidden, rope, mask, kv_cache, step)
        if kv_cache is not None:
            kv_cache.commit(step)
        return self.norm(hidden)

    def prepare(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                position_ids: torch.Tensor | None, kv_cache: KVCache | None, document_ids: torch.Tensor | None):
        """Embeddings, RoPE tables, mask and cache step of one forward (see `forward`), shared by every family."""
        hidden = self.embed_tokens(input_ids)  # (B, T, D)
        b, t = input_ids.shape
        step = None
        if document_ids is not None:
            if kv_cache is not None:
                raise ValueError("document_ids (packed rows) are for training forwards, not with a kv_cache")
            mask = document_mask(document_ids, attention_mask, self.config.sliding_window)
            if position_ids is None:
                position_ids = document_positions(document_ids)
        elif kv_cache is not None:
            new_mask = attention_mask if attention_mask is not None else input_ids.new_ones(b, t, dtype=torch.bool)
            step = kv_cache.plan(new_mask)
            mask = step.mask
            if position_ids is None:
                position_ids = step.positions
        else:
            mask = build_mask(attention_mask, t, self.config.sliding_window)
        if position_ids is None:
            position_ids = torch.arange(t, device=input_ids.device)[None, :]  # (1, T), broadcast over B
        rope = self.layers[0].self_attn.rope(position_ids, hidden.dtype) if len(self.layers) else None
        return hidden, rope, mask, step


class _MistralBase(nn.Module):
    """Trunk + head: shared construction, init, and the HF architecture name the checkpoint records."""

    hf_architecture = ""
    trunk_cls = MistralModel

    def __init__(self, cfg: MistralConfig, attn: AttentionConfig | None = None):
        super().__init__()
        self.config = cfg
        self.model = self.trunk_cls(cfg, attn or AttentionConfig())

    def hf_config_extra(self) -> dict:
        """Extra config.json keys the head needs (transformers reads num_labels from id2label)."""
        return {}

    def forward_hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                       position_ids: torch.Tensor | None = None, kv_cache: KVCache | None = None,
                       document_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Final-normed hidden states (B, T, D); fused losses multiply by the head in chunks from here."""
        return self.model(input_ids, attention_mask, position_ids, kv_cache, document_ids)

    def new_kv_cache(self, batch_size: int, max_len: int, dtype=None, device=None) -> KVCache:
        cfg = self.config
        weight = self.model.embed_tokens.weight
        return KVCache(cfg.num_hidden_layers, batch_size, max_len, cfg.num_key_value_heads, cfg.head_dim,
                       cfg.sliding_window, dtype=dtype or weight.dtype, device=device or weight.device)

    @torch.no_grad()
    def init_weights(self, std: float | None = None) -> None:
        """Truncated normal (mean 0, `std`, cut at +-3 std) for every matrix, ones for norms, zeros for biases.

        Raises on a module type it does not know, so a new parameter cannot silently keep torch's default init."""
        std = self.config.initializer_range if std is None else std
        for name, module in self.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.trunc_normal_(module.weight, std=std, a=-3 * std, b=3 * std)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    nn.init.zeros_(module.bias)
                if isinstance(module, nn.Embedding) and module.padding_idx is not None:
                    module.weight[module.padding_idx].zero_()  # as transformers: the pad row starts at zero
            elif isinstance(module, RMSNorm):
                module.reset_parameters()
            elif callable(getattr(module, "init_parameters", None)):
                module.init_parameters(std)  # modules with their own parameter layout (align.model.moe)
            elif any(True for _ in module.parameters(recurse=False)):
                raise TypeError(f"init_weights: no rule for {name} ({type(module).__name__})")
        self.tie_weights()

    def tie_weights(self) -> None:
        """Re-point tied parameters after a move or materialisation (no-op without tied weights)."""


def _embedding(num: int, dim: int, padding_idx: int | None) -> nn.Embedding:
    """nn.Embedding, without its default init when built on the meta device (checkpoint loading): torch's meta
    `normal_` loads Python decompositions on first use, ~1.1 s of every process that loads a checkpoint, for values
    that are never real. Elsewhere the default init runs as before (it draws from the RNG that init_weights follows)."""
    if torch.get_default_device().type != "meta":
        return nn.Embedding(num, dim, padding_idx=padding_idx)
    return nn.Embedding(num, dim, padding_idx=padding_idx, _weight=torch.empty(num, dim))


class _CausalLM(_MistralBase):
    """A trunk with an LM head (B, T, D) -> (B, T, V); lm_head shares embed_tokens.weight when tied. The base of
    every family's causal LM (the MoE one adds its router statistics to the trunk's forward)."""

    def __init__(self, cfg: MistralConfig, attn: AttentionConfig | None = None, init: bool = True):
        super().__init__(cfg, attn)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.tie_weights()
        if init:
            self.init_weights()

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight


class MistralForCausalLM(_CausalLM):
    """The policy/reference model. forward -> logits (B, T, V)."""

    hf_architecture = "MistralForCausalLM"

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, kv_cache: KVCache | None = None,
                document_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.lm_head(self.forward_hidden(input_ids, attention_mask, position_ids, kv_cache, document_ids))


class MistralForValueHead(_MistralBase):
    """Critic: forward -> values (B, T), one scalar per token (layout of HF MistralForSequenceClassification
    with num_labels=1, which TRL's PPO value model also uses)."""

    hf_architecture = "MistralForSequenceClassification"

    def __init__(self, cfg: MistralConfig, attn: AttentionConfig | None = None, init: bool = True):
        super().__init__(cfg, attn)
        self.score = nn.Linear(cfg.hidden_size, 1, bias=False)
        if init:
            self.init_weights()

    def hf_config_extra(self) -> dict:
        return {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.score(self.forward_hidden(input_ids, attention_mask, position_ids)).squeeze(-1)


class MistralForProcessReward(_MistralBase):
    """Process reward model: forward -> per-token scores (B, T, num_labels) (layout of HF
    MistralForTokenClassification: `score` with bias; num_labels=1 is one score logit per token)."""

    hf_architecture = "MistralForTokenClassification"

    def __init__(self, cfg: MistralConfig, attn: AttentionConfig | None = None, init: bool = True,
                 num_labels: int = 1):
        super().__init__(cfg, attn)
        self.num_labels = num_labels
        self.score = nn.Linear(cfg.hidden_size, num_labels, bias=True)
        if init:
            self.init_weights()

    def hf_config_extra(self) -> dict:
        labels = {str(i): f"LABEL_{i}" for i in range(self.num_labels)}
        return {"id2label": labels, "label2id": {v: int(k) for k, v in labels.items()}}

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.score(self.forward_hidden(input_ids, attention_mask, position_ids))
