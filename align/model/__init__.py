"""Mistral-family model in plain torch with transformers-compatible names and checkpoints (see mistral.py)."""

from align.model.attention import AttentionConfig, KVCache
from align.model.hf_config import MistralConfig
from align.model.config_io import load_hf_config, save_hf_config
from align.model.mistral import (
    MistralDecoderLayer,
    MistralForCausalLM,
    MistralForProcessReward,
    MistralForValueHead,
    MistralModel,
)

__all__ = [
    "AttentionConfig", "KVCache", "MistralConfig", "load_hf_config", "save_hf_config", "MistralDecoderLayer",
    "MistralForCausalLM", "MistralForProcessReward", "MistralForValueHead", "MistralModel",
]
