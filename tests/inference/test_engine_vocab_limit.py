"""A head padded past its tokenizer (Engine `vocab_limit`): the padded rows are never sampled, and what is sampled
equals an engine on the same model with its head cut to the tokenizer's rows."""

from __future__ import annotations

import pytest
import torch

from align.inference import Engine, EngineConfig, GenerationRequest, SamplingParams
from inference_helpers import random_prompts, small_model

LIMIT = 360  # the "tokenizer": small_model has 384 rows, so 24 are padding
PARAMS = [SamplingParams(0.0, max_new_tokens=6), SamplingParams(1.0, max_new_tokens=6),
          SamplingParams(0.8, top_k=30, top_p=0.9, max_new_tokens=6)]


def padded_model_and_cut_twin():
    """A model whose padded rows score high (the real rows' mean plus a few of their deviations: most steps pick a
    padded row without the limit), and a twin holding the same weights with the head cut to the first LIMIT rows."""
    model = small_model(seed=3, tie_word_embeddings=False)
    with torch.no_grad():
        head = model.lm_head.weight
        head[LIMIT:] = 4.0 * head[:LIMIT].mean(0, keepdim=True) + 3.0 * head[:LIMIT].std(0, keepdim=True)
    twin = small_model(seed=3, tie_word_embeddings=False, vocab_size=LIMIT)
    state = {k: (v[:LIMIT] if k in ("lm_head.weight", "model.embed_tokens.weight") else v)
             for k, v in model.state_dict().items()}
    twin.load_state_dict(state)
    return model, twin


def requests(n: int = 12):
    prompts = random_prompts([5, 11, 3, 17] * (n // 4), LIMIT, seed=7)
    return [GenerationRequest(p, PARAMS[i % 3], seed=i) for i, p in enumerate(prompts)]


@pytest.mark.parametrize("cpu_kernels", ["native", "torch"])
def test_padded_rows_are_never_sampled_and_the_rest_is_the_cut_heads(cpu_kernels):
    model, twin = padded_model_and_cut_twin()
    config = EngineConfig(cpu_kernels=cpu_kernels)
    unmasked = Engine(model, config).generate(requests())
    # the test can fail: without the limit the padded rows are what the model samples
    assert sum(t >= LIMIT for r in unmasked for t in r.token_ids) > len(unmasked)
    masked = Engine(model, config, vocab_limit=LIMIT).generate(requests())
    cut = Engine(twin, config).generate(requests())
    for m, c in zip(masked, cut):
        assert all(t < LIMIT for t in m.token_ids)
        assert m.token_ids == c.token_ids
        torch.testing.assert_close(torch.tensor(m.logprobs), torch.tensor(c.logprobs), atol=1e-5, rtol=0)
        torch.testing.assert_close(torch.tensor(m.model_logprobs), torch.tensor(c.model_logprobs), atol=1e-5, rtol=0)


def test_a_limit_at_or_above_the_head_changes_no_bit():
    model = small_model(seed=4)
    plain = Engine(model).generate(requests())
    for limit in (model.config.vocab_size, 32768):
        same = Engine(model, vocab_limit=limit).generate(requests())
        assert [(r.token_ids, r.logprobs, r.model_logprobs) for r in same] == \
            [(r.token_ids, r.logprobs, r.model_logprobs) for r in plain]


def test_a_non_positive_limit_is_refused():
    with pytest.raises(ValueError, match="vocab_limit"):
        Engine(small_model(), vocab_limit=0)


def test_the_rollout_client_passes_the_tokenizers_size_to_its_engine():
    from align.rollout import RolloutConfig, make_rollout_client

    client = make_rollout_client(RolloutConfig(), small_model(), vocab_limit=LIMIT)
    assert client.engine.vocab_limit == LIMIT and client.engine.runner.vocab_limit == LIMIT
