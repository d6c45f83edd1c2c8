"""align.rl.advantages: group-relative advantages by hand."""

import math

import pytest
import torch

from align.rl.advantages import AdvantageConfig, group_advantages, zero_variance


def test_group_std_by_hand():
    # group [1, 0, 0, 1]: mean 0.5, population std 0.5 -> A = +-1 / (0.5 + eps)
    a = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), AdvantageConfig(eps=0.0))
    assert a.tolist() == [[1.0, -1.0, -1.0, 1.0]]
    # unbiased std (ddof 1, TRL's torch.std): sqrt(1/3)
    a = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), AdvantageConfig(eps=0.0, unbiased_std=True))
    assert a[0, 0].item() == pytest.approx(0.5 / math.sqrt(1 / 3))


def test_dr_grpo_has_no_std_and_a_constant():
    a = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0], [2.0, 2.0, 2.0, 2.0]]),
                         AdvantageConfig(scale="none", constant=2.0))
    assert a.tolist() == [[0.375, -0.125, -0.125, -0.125], [0.0, 0.0, 0.0, 0.0]]


def test_batch_std_centres_per_group_and_scales_by_the_batch():
    r = torch.tensor([[1.0, 0.0], [3.0, 1.0]])  # centred: [.5, -.5], [1, -1]; population std sqrt(0.625)
    a = group_advantages(r, AdvantageConfig(scale="batch_std", eps=0.0))
    assert torch.allclose(a, torch.tensor([[0.5, -0.5], [1.0, -1.0]]) / math.sqrt(0.625))


def test_zero_variance_groups_get_zero_advantage_and_are_flagged():
    r = torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    assert zero_variance(r).tolist() == [True, False, True]
    a = group_advantages(r)
    assert a[0].abs().sum() == 0 and a[2].abs().sum() == 0


def test_clip_and_validation():
    a = group_advantages(torch.tensor([[10.0, 0.0, 0.0, 0.0]]), AdvantageConfig(scale="none", clip=2.0))
    assert a.max().item() == 2.0
    with pytest.raises(ValueError, match="prompts, samples"):
        group_advantages(torch.zeros(4))
    with pytest.raises(ValueError, match="constant"):
        AdvantageConfig(constant=0.0)


def test_negative_scale_weights_only_the_negative_advantages():
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0]])  # Dr. GRPO: [.75, -.25, -.25, -.25]
    a = group_advantages(r, AdvantageConfig(scale="none", negative_scale=0.2))
    assert torch.allclose(a, torch.tensor([[0.75, -0.05, -0.05, -0.05]]))
    assert group_advantages(r, AdvantageConfig(scale="none", negative_scale=0.0)).tolist() == [[0.75, 0.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match="negative_scale"):
        AdvantageConfig(negative_scale=1.5)
