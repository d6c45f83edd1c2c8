"""Oracle tier: greedy tokens equal transformers' generate; top-k/top-p masks equal transformers' warpers."""

from __future__ import annotations

import pytest
import torch

from align.inference import Engine, EngineConfig, GenerationRequest, SamplingParams
from align.inference.sampler import RowParams, apply_top_k, apply_top_p, sample
from inference_helpers import random_prompts, small_model

pytestmark = pytest.mark.oracle
transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("shape", ["small", "tiny-profile"])
def test_greedy_tokens_equal_transformers_generate(shape):
    from model_helpers import hf_twin

    overrides = {} if shape == "small" else dict(vocab_size=32768, hidden_size=256, intermediate_size=768,
                                                 num_hidden_layers=4, num_attention_heads=8)
    model = small_model(seed=3, **overrides)
    twin = hf_twin(model)
    prompts = random_prompts([6, 23, 14], model.config.vocab_size, seed=12)
    new = 16
    ours = Engine(model, EngineConfig(block_size=8, max_num_batched_tokens=32)).generate(
        [GenerationRequest(p, SamplingParams(temperature=0.0, max_new_tokens=new)) for p in prompts])
    for p, r in zip(prompts, ours):
        out = twin.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                            max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
        assert r.token_ids == out[0, len(p):].tolist()


def test_top_k_and_top_p_masks_equal_transformers_warpers():
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    g = torch.Generator().manual_seed(5)
    logits = torch.randn(5, 1000, generator=g) * 3
    for k in (1, 7, 50):
        ours = apply_top_k(logits, torch.full((5,), k))
        assert torch.equal(ours.isinf(), TopKLogitsWarper(k)(None, logits.clone()).isinf())
    for p in (0.1, 0.5, 0.9):
        ours = apply_top_p(logits, torch.full((5,), p))
        assert torch.equal(ours.isinf(), TopPLogitsWarper(p)(None, logits.clone()).isinf())


def test_sampling_logprob_is_under_the_warped_distribution_of_transformers():
    from transformers.generation.logits_process import (LogitsProcessorList, TemperatureLogitsWarper,
                                                        TopKLogitsWarper, TopPLogitsWarper)

    g = torch.Generator().manual_seed(6)
    logits = torch.randn(8, 400, generator=g) * 2
    warp = LogitsProcessorList([TemperatureLogitsWarper(0.8), TopKLogitsWarper(40), TopPLogitsWarper(0.9)])
    params = RowParams(torch.full((8,), 0.8), torch.full((8,), 40), torch.full((8,), 0.9),
                       torch.rand(8, generator=g, dtype=torch.float64))
    tok, lp, _ = sample(logits, params)
    ref = warp(None, logits.clone()).log_softmax(-1)
    assert torch.isfinite(ref.gather(1, tok[:, None])).all()  # never a token the warpers removed
    torch.testing.assert_close(lp, ref.gather(1, tok[:, None]).squeeze(1))
