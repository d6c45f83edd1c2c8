"""align.inference.receipts: the checkpoint identity a receipt records (tested here: it is the model's identity)."""

from __future__ import annotations

import torch

from align.inference.receipts import checkpoint_identity
from align.model import MistralForCausalLM, MistralForValueHead
from align.model.checkpoint import checkpoint_content_hash, save_checkpoint
from model_helpers import tiny_config


def test_identity_fields(tmp_path):
    model = MistralForCausalLM(tiny_config(tie_word_embeddings=True))
    out = save_checkpoint(model, tmp_path / "ck", dtype=torch.bfloat16)
    ident = checkpoint_identity(out)
    assert ident["content_hash"] == checkpoint_content_hash(out, recompute=True)
    assert ident["architecture"] == "MistralForCausalLM" and ident["dtypes"] == ["BF16"]
    assert ident["num_parameters"] == sum(p.numel() for p in model.parameters())  # tied head counted once
    assert ident["config"]["tie_word_embeddings"] is True


def test_same_trunk_different_head_is_a_different_identity(tmp_path):
    torch.manual_seed(0)
    value = MistralForValueHead(tiny_config())
    a = checkpoint_identity(save_checkpoint(value, tmp_path / "a"))
    b = checkpoint_identity(save_checkpoint(value, tmp_path / "b", max_shard_bytes=40_000))
    assert a["content_hash"] == b["content_hash"] and a["architecture"] == "MistralForSequenceClassification"
    policy = MistralForCausalLM(tiny_config())
    policy.model.load_state_dict(value.model.state_dict())
    assert checkpoint_identity(save_checkpoint(policy, tmp_path / "p"))["content_hash"] != a["content_hash"]
