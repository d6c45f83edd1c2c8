"""Oracle: align's Mistral equals transformers' MistralForCausalLM (and the classification heads) on tiny random
configs: logits, loss and gradients, fp32 and bf16, GQA ratios 1/2/4, tied and untied, padded batches, and a
sliding window that bites."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from align.model import MistralForCausalLM, MistralForProcessReward, MistralForValueHead
from align.model.layers import rope_inv_freq
from model_helpers import hf_twin, random_ids, tiny_config

pytestmark = pytest.mark.oracle
transformers = pytest.importorskip("transformers")

GRAD_PARAMS = ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
               "model.layers.0.self_attn.k_proj.weight", "model.layers.1.mlp.down_proj.weight",
               "model.layers.1.input_layernorm.weight", "model.norm.weight")


def lm_loss(logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    labels = ids[:, 1:].clone()
    if mask is not None:
        labels[~mask[:, 1:]] = -100
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels.flatten())


def fp32_inv_freq(twin) -> None:
    """transformers' `model.to(bf16)` also rounds its RoPE inv_freq buffer to bf16 (from_pretrained does not);
    restore the fp32 frequencies so the comparison is of the models, not of that cast."""
    emb = twin.model.rotary_emb
    emb.inv_freq = rope_inv_freq(twin.config.head_dim, twin.config.rope_parameters["rope_theta"])


def compare(ours, twin, ids, mask=None, *, tol: float, grad_tol: float) -> None:
    logits = ours(ids, mask)
    ref = twin(ids, attention_mask=None if mask is None else mask.long()).logits
    keep = torch.ones(ids.shape, dtype=torch.bool) if mask is None else mask
    scale = ref.abs().max().float().item()
    assert (logits.float() - ref.float())[keep].abs().max().item() <= tol * max(1.0, scale)
    loss, ref_loss = lm_loss(logits, ids, mask), lm_loss(ref, ids, mask)
    assert abs(loss.item() - ref_loss.item()) <= tol * max(1.0, ref_loss.item())
    loss.backward()
    ref_loss.backward()
    ours_p, ref_p = dict(ours.named_parameters()), dict(twin.named_parameters())
    for name in GRAD_PARAMS:
        g, rg = ours_p[name].grad.float(), ref_p[name].grad.float()
        assert (g - rg).abs().max().item() <= grad_tol * max(1e-3, rg.abs().max().item()), name


@pytest.mark.parametrize("kv_heads", [4, 2, 1])  # GQA ratios 1, 2, 4
@pytest.mark.parametrize("tied", [False, True])
def test_fp32_logits_loss_grads(kv_heads, tied):
    torch.manual_seed(kv_heads)
    cfg = tiny_config(num_key_value_heads=kv_heads, tie_word_embeddings=tied)
    ours = MistralForCausalLM(cfg)
    twin = hf_twin(ours)
    if tied:
        assert twin.lm_head.weight.data_ptr() == twin.model.embed_tokens.weight.data_ptr()
    compare(ours, twin, random_ids(cfg, 3, 33), tol=1e-5, grad_tol=1e-5)


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_fp32_padded_batch(impl):
    from align.model import AttentionConfig

    torch.manual_seed(1)
    cfg = tiny_config(num_key_value_heads=2, pad_token_id=0)
    ours = MistralForCausalLM(cfg, AttentionConfig(impl=impl))
    twin = hf_twin(ours)
    ids = random_ids(cfg, 3, 20)
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[0, 12:] = False
    mask[2, 5:] = False  # right padding, different lengths
    ids[~mask] = 0
    compare(ours, twin, ids, mask, tol=1e-5, grad_tol=1e-5)


def test_fp32_sliding_window_bites():
    torch.manual_seed(2)
    cfg = tiny_config(sliding_window=7)
    ours = MistralForCausalLM(cfg)
    twin = hf_twin(ours)
    compare(ours, twin, random_ids(cfg, 2, 24), tol=1e-5, grad_tol=1e-5)


@pytest.mark.parametrize("kv_heads", [4, 1])
def test_bf16_matches_to_rounding(kv_heads):
    """bf16 parameters on both sides. Measured: bitwise equal once transformers' inv_freq is fp32 (see
    fp32_inv_freq); the bound asserted is one bf16 ulp of the largest logit (2^-7 relative)."""
    torch.manual_seed(3)
    cfg = tiny_config(num_key_value_heads=kv_heads)
    ours = MistralForCausalLM(cfg)
    twin = hf_twin(ours).to(torch.bfloat16)
    fp32_inv_freq(twin)
    ours = ours.to(torch.bfloat16)
    compare(ours, twin, random_ids(cfg, 2, 24), tol=2**-7, grad_tol=2**-6)


def test_value_head_matches_sequence_classification_layout():
    torch.manual_seed(4)
    cfg = tiny_config()
    ours = MistralForValueHead(cfg)
    twin = hf_twin(ours, "MistralForSequenceClassification", num_labels=1)
    ids = random_ids(cfg, 2, 16)
    hidden = twin.model(ids).last_hidden_state
    ref = twin.score(hidden).squeeze(-1)  # HF's per-token values before it pools the last token
    values = ours(ids)
    assert values.shape == (2, 16)
    assert (values - ref).abs().max().item() <= 1e-5


@pytest.mark.parametrize("num_labels", [1, 2])
def test_process_reward_matches_token_classification(num_labels):
    torch.manual_seed(5)
    cfg = tiny_config()
    ours = MistralForProcessReward(cfg, num_labels=num_labels)
    torch.nn.init.normal_(ours.score.bias)  # a zero bias would not test that the bias is applied
    twin = hf_twin(ours, "MistralForTokenClassification", num_labels=num_labels)
    ids = random_ids(cfg, 2, 16)
    scores = ours(ids)
    assert scores.shape == (2, 16, num_labels)
    assert (scores - twin(ids).logits).abs().max().item() <= 1e-5
