"""GPU tier: the engine on CUDA gives the no-cache reference's greedy tokens and log-probs (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch

from align.inference import Engine, EngineConfig, GenerationRequest, SamplingParams
from align.inference.bucketed import score_completions
from inference_helpers import naive_greedy, random_prompts, small_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_engine_on_cuda_matches_the_reference_loop():
    model = small_model().cuda()
    prompts = random_prompts([5, 23, 40], model.config.vocab_size, seed=1)
    engine = Engine(model, EngineConfig(max_num_batched_tokens=32))
    params = SamplingParams(temperature=0.0, max_new_tokens=12)
    results = engine.generate([GenerationRequest(p, params) for p in prompts])
    cpu_model = small_model()
    for p, r in zip(prompts, results):
        assert r.token_ids == naive_greedy(cpu_model, p, 12)
    scored = score_completions(model, prompts, [r.token_ids for r in results], return_token_logprobs=True)
    for r, lp in zip(results, scored.token_logprobs):
        torch.testing.assert_close(torch.tensor(r.model_logprobs), lp, atol=1e-4, rtol=0)
