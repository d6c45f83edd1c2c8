"""Oracle: per-sequence log-probs from the fused chunked path equal transformers' model log-probs on a tiny Mistral
(log_softmax of its logits gathered at the completion labels), in value and in the gradient reaching every model
parameter; and align's own MistralForCausalLM holding the same weights scores the same."""

from __future__ import annotations

import pytest
import torch

from align.kernels.fused_dpo import IGNORE_INDEX, model_sequence_logprobs, next_token_labels, sequence_logprobs

pytest.importorskip("transformers")
pytestmark = pytest.mark.oracle

from trl_fixtures import tiny_hf_mistral  # noqa: E402


def _batch(vocab: int, b: int = 4, t: int = 12, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (b, t), generator=g)
    lengths = torch.tensor([12, 9, 12, 6])
    prompt = torch.tensor([4, 3, 7, 2])
    pos = torch.arange(t)[None, :]
    attention = pos < lengths[:, None]
    labels = ids.masked_fill((pos < prompt[:, None]) | ~attention, IGNORE_INDEX)  # input-aligned, as transformers
    return ids, attention, labels


def _hf_logprobs(model, ids, attention, labels):
    logits = model(input_ids=ids, attention_mask=attention.long()).logits.double()  # (B, T, V)
    shifted = next_token_labels(labels)
    logp = torch.log_softmax(logits, -1).gather(2, shifted.clamp(min=0)[..., None]).squeeze(2)
    return (logp * (shifted != IGNORE_INDEX)).sum(1)


def test_fused_equals_transformers_logprobs_and_param_grads():
    model = tiny_hf_mistral(vocab_size=96, seed=0, dtype=torch.float64)
    ids, attention, labels = _batch(96)
    upstream = torch.tensor([1.0, -0.5, 0.25, 2.0], dtype=torch.float64)
    params = list(model.parameters())

    oracle = _hf_logprobs(model, ids, attention, labels)
    g_oracle = torch.autograd.grad((oracle * upstream).sum(), params)

    hidden = model.model(input_ids=ids, attention_mask=attention.long()).last_hidden_state  # (B, T, D)
    fused = sequence_logprobs(hidden, model.lm_head.weight, next_token_labels(labels), chunk_size=5)
    g_fused = torch.autograd.grad((fused.logps * upstream).sum(), params)

    torch.testing.assert_close(fused.logps, oracle, atol=1e-10, rtol=1e-10)
    for a, b in zip(g_fused, g_oracle, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)
    assert fused.tokens.tolist() == [8, 6, 5, 4]


def test_align_model_scores_like_transformers():
    from align.model import MistralConfig, MistralForCausalLM

    hf = tiny_hf_mistral(vocab_size=96, seed=1)
    hc = hf.config
    cfg = MistralConfig(vocab_size=96, hidden_size=hc.hidden_size, intermediate_size=hc.intermediate_size,
                        num_hidden_layers=hc.num_hidden_layers, num_attention_heads=hc.num_attention_heads,
                        num_key_value_heads=hc.num_key_value_heads, max_position_embeddings=1024,
                        rope_theta=hf.config.rope_parameters["rope_theta"], rms_norm_eps=hc.rms_norm_eps,
                        pad_token_id=0)
    ours = MistralForCausalLM(cfg)
    ours.load_state_dict(hf.state_dict())
    ids, attention, labels = _batch(96, seed=2)
    with torch.no_grad():
        got = model_sequence_logprobs(ours, ids, attention, labels, chunk_size=7)
        want = _hf_logprobs(hf, ids, attention, labels)
    torch.testing.assert_close(got.logps.double(), want, atol=1e-5, rtol=1e-6)  # fp32 model, ~1e-6 seen
