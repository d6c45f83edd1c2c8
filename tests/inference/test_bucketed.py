"""Batched scoring of given completions against one full forward per sequence."""

from __future__ import annotations

import pytest
import torch

from align.inference.bucketed import score_completions
from inference_helpers import full_forward_logits, random_prompts, small_model


@pytest.fixture(scope="module")
def model():
    return small_model()


def test_scores_equal_a_full_forward_per_sequence_whatever_the_batching(model):
    V = model.config.vocab_size
    prompts = random_prompts([3, 17, 8, 30, 1, 12], V, seed=1)
    completions = random_prompts([9, 2, 25, 5, 14, 0], V, seed=2)
    ref = []
    for p, c in zip(prompts, completions):
        lsm = full_forward_logits(model, p, c).log_softmax(-1)
        ref.append(lsm.gather(1, torch.tensor(c, dtype=torch.long)[:, None]).squeeze(1))
    for batch_size, bucket in ((1, 1), (4, 16), (8, 64)):
        out = score_completions(model, prompts, completions, batch_size=batch_size, bucket=bucket,
                                return_token_logprobs=True)
        assert out.token_counts.tolist() == [len(c) for c in completions]
        for got, want in zip(out.token_logprobs, ref):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        torch.testing.assert_close(out.logprob_sums, torch.stack([r.sum() for r in ref]), atol=1e-4, rtol=0)
    assert out.logprob_sums[5] == 0.0  # an empty completion


def test_bad_inputs_are_named(model):
    with pytest.raises(ValueError, match="row 1 has an empty prompt"):
        score_completions(model, [[1], []], [[2], [3]])
    with pytest.raises(ValueError, match="2 prompts but 1 completions"):
        score_completions(model, [[1], [2]], [[2]])
