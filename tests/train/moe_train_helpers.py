"""Builders shared by the MoE train tests and their 2-rank worker: a tiny OLMoE and aux-only batches."""

from __future__ import annotations

import torch

from align.model.olmoe import OlmoeConfig, OlmoeForCausalLM
from train_helpers import sft_batch

LB, Z = 0.7, 0.2  # aux coefficients of the distributed test


def tiny_moe(seed: int = 0, dtype=torch.float32) -> OlmoeForCausalLM:
    torch.manual_seed(seed)
    return OlmoeForCausalLM(OlmoeConfig(vocab_size=256, hidden_size=32, intermediate_size=16, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                        num_experts=4, num_experts_per_tok=2, pad_token_id=0,
                                        eos_token_id=2)).to(dtype)


def aux_only_batch(seed: int) -> dict:
    """A padded batch with no label token: the window's loss is the aux terms alone."""
    batch = sft_batch(2, 10, seed=100 + seed)
    return dict(batch, labels=torch.full_like(batch["labels"], -100))
