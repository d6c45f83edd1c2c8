"""Builders for the Llama / Qwen 2 / Qwen 3 tests: small configs of several shapes, models with every parameter
random (biases and norm weights included, so a dropped bias or norm shows), and the transformers twin."""

from __future__ import annotations

import torch

from align.model.config_io import hf_config_dict
from align.model.dense_configs import LlamaConfig, Qwen2Config, Qwen3Config
from align.model.family import FAMILIES
from align.model.hf_config import RopeScaling

BASE = dict(vocab_size=160, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=256, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)
# long wavelengths of head_dim 16 at theta 5e5 reach ~6e5: an original length of 64 puts frequencies in all three
# of llama3's regimes (kept, divided by factor, blended)
LLAMA3_ROPE = RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64)
CONFIGS = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}


def dense_config(family: str, **overrides):
    base = dict(BASE, num_key_value_heads=2, rope_theta=10000.0)
    if family == "llama":
        base.update(rope_theta=500000.0, rope_scaling=LLAMA3_ROPE)
    if family == "qwen3":
        base.update(head_dim=32)  # explicit, != hidden_size / heads, as in the released models
    base.update(overrides)
    return CONFIGS[family](**base)


@torch.no_grad()
def randomize(model, seed: int = 0):
    """Every parameter random: matrices N(0, 0.1), norm weights U(0.5, 1.5), biases N(0, 0.1)."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.copy_(torch.rand(p.shape, generator=g) + 0.5)
        else:
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return model


def dense_model(family: str, seed: int = 0, cls=None, num_labels: int | None = None, **overrides):
    cfg = dense_config(family, **overrides)
    torch.manual_seed(seed)
    cls = cls or FAMILIES[family].causal_lm
    model = cls(cfg) if num_labels is None else cls(cfg, num_labels=num_labels)
    return randomize(model, seed).eval()


def hf_twin(model, cls_name: str | None = None):
    """The transformers model of the same architecture (its config built from the config.json align writes) holding
    exactly `model`'s weights."""
    import transformers

    data = hf_config_dict(model.config, architecture=model.hf_architecture, extra=model.hf_config_extra())
    hcfg = transformers.AutoConfig.for_model(**data)
    twin = getattr(transformers, cls_name or model.hf_architecture)(hcfg).eval()
    missing, unexpected = twin.load_state_dict(model.state_dict(), strict=False)
    assert not unexpected and not [k for k in missing if k != "lm_head.weight"], (missing, unexpected)
    twin.tie_weights()
    return twin


def random_ids(cfg, b: int, t: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.vocab_size, (b, t), generator=g)
