"""align.rl.ppo.loss: the clipped terms take the right arm and pass gradient only where PPO says they should.

TRL 1.x (the installed oracle) no longer has PPO's loss functions, so the checks are the defining properties:
inside the clip range the surrogate is -mean(A rho) with gradient -A rho / n; past it on the side the advantage
favours, the gradient is exactly zero; the value loss is 1/2 MSE while V stays within c of the rollout's values."""

from __future__ import annotations

import pytest
import torch

from align.rl.ppo.loss import PpoLossConfig, entropy_bonus, policy_loss, value_loss


def test_policy_loss_inside_clip_is_the_plain_surrogate():
    g = torch.Generator().manual_seed(0)
    old = torch.randn(3, 5, generator=g, dtype=torch.float64)
    logp = (old + 0.05 * torch.randn(3, 5, generator=g, dtype=torch.float64)).requires_grad_()
    adv = torch.randn(3, 5, generator=g, dtype=torch.float64)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[2, 3:] = False
    loss, frac = policy_loss(logp, old, adv, mask, clip=0.2)
    ratio = torch.exp(logp.detach() - old)
    assert torch.allclose(loss, -(adv * ratio)[mask].mean(), atol=1e-12) and frac == 0
    loss.backward()
    assert torch.allclose(logp.grad, -(adv * ratio) * mask / mask.sum(), atol=1e-12)


def test_policy_loss_clipped_tokens_have_zero_gradient():
    old = torch.zeros(1, 4, dtype=torch.float64)
    # ratios 1.5 (A>0: clipped), 1.5 (A<0: not clipped, pessimistic arm), 0.5 (A<0: clipped), 0.5 (A>0: not)
    logp = torch.log(torch.tensor([[1.5, 1.5, 0.5, 0.5]], dtype=torch.float64)).requires_grad_()
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0]], dtype=torch.float64)
    loss, frac = policy_loss(logp, old, adv, torch.ones(1, 4, dtype=torch.bool), clip=0.2)
    expected = torch.tensor([-1.2, 1.5, 0.8, -0.5], dtype=torch.float64).mean()
    assert torch.allclose(loss, expected, atol=1e-12) and frac == 0.5
    loss.backward()
    assert logp.grad[0, 0] == 0 and logp.grad[0, 2] == 0
    assert torch.allclose(logp.grad[0, [1, 3]], torch.tensor([1.5, -0.5], dtype=torch.float64) / 4, atol=1e-12)


def test_value_loss_clips_moves_past_c():
    old = torch.zeros(1, 3, dtype=torch.float64)
    returns = torch.tensor([[0.05, 1.0, -1.0]], dtype=torch.float64)
    values = torch.tensor([[0.1, 0.5, 0.5]], dtype=torch.float64).requires_grad_()
    loss, frac = value_loss(values, old, returns, torch.ones(1, 3, dtype=torch.bool), value_clip=0.2)
    # token 0 inside c: plain; token 1 moved 0.5 toward R: clipped arm (0.2 - 1)^2 larger; token 2 moved away: plain
    per = torch.tensor([0.05 ** 2, 0.8 ** 2, 1.5 ** 2], dtype=torch.float64)
    assert torch.allclose(loss, 0.5 * per.mean(), atol=1e-12) and abs(frac.item() - 1 / 3) < 1e-12
    loss.backward()
    assert values.grad[0, 1] == 0
    assert torch.allclose(values.grad[0, [0, 2]], torch.tensor([0.05, 1.5], dtype=torch.float64) / 3, atol=1e-12)


def test_entropy_bonus_is_negative_masked_mean():
    h = torch.tensor([[1.0, 2.0, 9.0]])
    assert entropy_bonus(h, torch.tensor([[True, True, False]]), coef=0.1).item() == pytest.approx(-0.15)


def test_config_refuses_bad_values():
    with pytest.raises(ValueError, match="clip"):
        PpoLossConfig(clip=0)
    with pytest.raises(ValueError, match="entropy_coef"):
        PpoLossConfig(entropy_coef=-1)
