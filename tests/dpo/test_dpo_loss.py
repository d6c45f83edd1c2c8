"""Properties of align.train.dpo_loss that no reference library checks: the DPOP penalty (not in TRL 1.16), the
optimum of the label-smoothed loss, config validation. Parity with TRL is in test_dpo_loss_oracle.py."""

from __future__ import annotations

import math

import pytest
import torch

from align.train.dpo_loss import DpoLossConfig, dpo_loss, dpop_penalty, sigmoid_preference_loss


def _arms(pc, pr, rc, rr):
    t = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (pc, pr)]
    return t[0], t[1], torch.tensor(rc, dtype=torch.float64), torch.tensor(rr, dtype=torch.float64)


def test_dpop_inactive_while_chosen_stays_above_reference():
    pc, pr, rc, rr = _arms([-3.0, -2.0], [-4.0, -6.0], [-3.5, -2.0], [-4.5, -5.0])
    plain = dpo_loss(pc, pr, rc, rr, DpoLossConfig(beta=0.2))
    dpop = dpo_loss(pc, pr, rc, rr, DpoLossConfig(beta=0.2, dpop_lambda=50.0))
    assert torch.equal(plain.loss, dpop.loss)


def test_dpop_scales_the_chosen_gradient_by_one_plus_lambda_when_active():
    """With p = -rho_c > 0, z = beta * ((1 + lambda) * rho_c - rho_r): the chosen arm's gradient is (1 + lambda) times
    the rejected arm's, with opposite sign; without the penalty the two are equal and opposite."""
    lam = 5.0
    for cfg, ratio in [(DpoLossConfig(beta=0.3, dpop_lambda=lam), 1 + lam), (DpoLossConfig(beta=0.3), 1.0)]:
        pc, pr, rc, rr = _arms([-4.0], [-5.0], [-3.0], [-5.5])
        dpo_loss(pc, pr, rc, rr, cfg).loss.backward()
        assert float(pc.grad / pr.grad) == pytest.approx(-ratio, rel=1e-12)
    assert float(dpop_penalty(torch.tensor(-4.0), torch.tensor(-3.0))) == 1.0


def test_dpop_raises_the_loss_when_the_chosen_log_prob_falls():
    pc, pr, rc, rr = _arms([-4.0], [-5.0], [-3.0], [-5.5])
    plain = dpo_loss(pc, pr, rc, rr, DpoLossConfig(beta=0.3)).loss
    assert dpo_loss(pc, pr, rc, rr, DpoLossConfig(beta=0.3, dpop_lambda=1.0)).loss > plain


def test_label_smoothing_optimum_is_finite():
    """cDPO does not push the margin to infinity: its minimum is at z* = log((1 - eps) / eps)."""
    eps = 0.1
    z = torch.tensor(math.log((1 - eps) / eps), dtype=torch.float64, requires_grad=True)
    sigmoid_preference_loss(z, eps).backward()
    assert abs(float(z.grad)) < 1e-12
    zero = torch.zeros((), dtype=torch.float64)
    assert float(sigmoid_preference_loss(zero, eps)) == pytest.approx(math.log(2.0))


def test_nll_mix_needs_token_counts_and_adds_alpha_times_nll():
    pc, pr, rc, rr = _arms([-4.0, -6.0], [-5.0, -5.0], [-3.0, -6.0], [-5.5, -5.0])
    with pytest.raises(ValueError, match="chosen_tokens"):
        dpo_loss(pc, pr, rc, rr, DpoLossConfig(nll_alpha=1.0))
    tokens = torch.tensor([2, 3])
    base = dpo_loss(pc, pr, rc, rr, DpoLossConfig(), chosen_tokens=tokens)
    mixed = dpo_loss(pc, pr, rc, rr, DpoLossConfig(nll_alpha=0.5), chosen_tokens=tokens)
    assert float(mixed.nll) == pytest.approx(10.0 / 5.0)
    assert float(mixed.loss - base.loss) == pytest.approx(0.5 * 2.0)


def test_metrics_and_detached_rewards():
    pc, pr, rc, rr = _arms([-1.0, -2.0], [-3.0, -1.0], [-2.0, -2.0], [-2.0, -2.0])
    out = dpo_loss(pc, pr, rc, rr, DpoLossConfig(beta=0.5))
    assert not out.chosen_rewards.requires_grad and not out.rejected_rewards.requires_grad
    m = out.metrics()
    assert m["rewards/chosen"] == pytest.approx(0.25) and m["rewards/rejected"] == pytest.approx(0.0)
    assert m["rewards/accuracy"] == 0.5 and m["rewards/margin"] == pytest.approx(0.25)


@pytest.mark.parametrize("kwargs", [dict(beta=0.0), dict(label_smoothing=0.5), dict(dpop_lambda=-1.0),
                                    dict(nll_alpha=-0.1)])
def test_config_rejects_out_of_range_values(kwargs):
    with pytest.raises(ValueError):
        DpoLossConfig(**kwargs)
