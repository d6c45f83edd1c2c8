"""Builders for the MoE tests: tiny OLMoE configs and the matching transformers model (oracle tier only)."""

from __future__ import annotations

import torch

from align.model.olmoe import OlmoeConfig


def tiny_olmoe(**overrides) -> OlmoeConfig:
    base = dict(vocab_size=128, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256, rope_theta=10000.0, rms_norm_eps=1e-5,
                num_experts=8, num_experts_per_tok=2, pad_token_id=1, bos_token_id=None, eos_token_id=2)
    base.update(overrides)
    return OlmoeConfig(**base)


def hf_olmoe_config(cfg: OlmoeConfig):
    import transformers

    return transformers.OlmoeConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, max_position_embeddings=cfg.max_position_embeddings,
        rms_norm_eps=cfg.rms_norm_eps, pad_token_id=cfg.pad_token_id, bos_token_id=cfg.bos_token_id,
        eos_token_id=cfg.eos_token_id, tie_word_embeddings=cfg.tie_word_embeddings, num_experts=cfg.num_experts,
        num_experts_per_tok=cfg.num_experts_per_tok, norm_topk_prob=cfg.norm_topk_prob,
        initializer_range=cfg.initializer_range, router_aux_loss_coef=cfg.router_aux_loss_coef,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta})


def hf_olmoe_twin(model):
    """transformers' OlmoeForCausalLM holding exactly `model`'s weights (eager attention, eval mode)."""
    import transformers

    hcfg = hf_olmoe_config(model.config)
    hcfg._attn_implementation = "eager"
    twin = transformers.OlmoeForCausalLM(hcfg).eval()
    missing, unexpected = twin.load_state_dict(model.state_dict(), strict=False)
    assert not unexpected and not [k for k in missing if k != "lm_head.weight"], (missing, unexpected)
    return twin


def random_ids(cfg, b: int, t: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.vocab_size, (b, t), generator=g)
