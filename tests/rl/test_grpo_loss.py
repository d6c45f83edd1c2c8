"""align.rl.grpo_loss: every formula against a small case computed by hand (numbers in the comments)."""

import math

import pytest
import torch

from align.rl.grpo_loss import (GrpoLossConfig, clipped_surrogate, k3_kl, loss_sum, loss_units, policy_ratio,
                                policy_terms, train_infer_weight)

F64 = torch.float64


def t(x):
    return torch.tensor(x, dtype=F64)


def test_token_ratio_is_exp_of_the_log_difference():
    r = policy_ratio(t([[0.0, -1.0]]), t([[0.0, -1.5]]), t([[1.0, 1.0]]), "token")
    assert torch.allclose(r, t([[1.0, math.exp(0.5)]]))


def test_sequence_ratio_is_the_geometric_mean_over_masked_tokens():
    # log ratios 0.2, 0.4 and a masked 5.0: s = exp((0.2 + 0.4) / 2) = exp(0.3)
    logp, old, mask = t([[0.2, 0.4, 5.0]]), t([[0.0, 0.0, 0.0]]), t([[1.0, 1.0, 0.0]])
    s = policy_ratio(logp, old, mask, "sequence")
    assert s.shape == (1, 1) and math.isclose(float(s), math.exp(0.3), rel_tol=1e-12)


def test_clipped_surrogate_by_hand():
    ratio = t([[0.5, 1.1, 1.5]])
    # A = +1: -min(r, clip(r, 0.8, 1.2)) = -[min(0.5, 0.8), min(1.1, 1.1), min(1.5, 1.2)] = -[0.5, 1.1, 1.2]
    assert torch.allclose(clipped_surrogate(ratio, t([1.0]), 0.2, 0.2), t([[-0.5, -1.1, -1.2]]))
    # A = -1: -min(-r, -clip(r)) = max(r, clip(r)) = [0.8, 1.1, 1.5]
    assert torch.allclose(clipped_surrogate(ratio, t([-1.0]), 0.2, 0.2), t([[0.8, 1.1, 1.5]]))
    # clip-higher (eps_high 0.28): A > 0, r = 1.5 is cut at 1.28 instead of 1.2
    assert torch.allclose(clipped_surrogate(ratio, t([1.0]), 0.2, 0.28), t([[-0.5, -1.1, -1.28]]))
    # dual clip 1.4: A < 0, r = 1.5 pulls with 1.4 at most
    assert torch.allclose(clipped_surrogate(ratio, t([-1.0]), 0.2, 0.2, dual_clip=1.4), t([[0.8, 1.1, 1.4]]))


def test_clip_cuts_the_gradient_only_where_it_binds():
    logp = torch.zeros(1, 3, dtype=F64, requires_grad=True)
    old = t([[0.0, -0.5, 0.5]])  # ratios exp(0)=1, exp(0.5)=1.65 (clipped for A>0), exp(-0.5)=0.61
    clipped_surrogate(policy_ratio(logp, old, torch.ones(1, 3), "token"), t([1.0]), 0.2, 0.2).sum().backward()
    # d(-r A)/dlogp = -r where unclipped; 0 where the clipped arm is the min
    assert torch.allclose(logp.grad, t([[-1.0, 0.0, -math.exp(-0.5)]]))


def test_train_infer_weight_truncates_and_masks_outliers():
    old, roll, mask = t([[0.0, 0.0, 0.0, 0.0]]), t([[0.0, -1.0, 1.0, -3.0]]), t([[1.0, 1.0, 1.0, 0.0]])
    w = train_infer_weight(old, roll, mask, "token", cap=2.0, mask_low=0.5)
    # rho = exp(old - roll) = [1, e, 1/e, (padding) 1]; cap 2 -> [1, 2, 1/e, 1]; 1/e < 0.5 -> outlier -> 0
    assert torch.allclose(w.rho, t([[1.0, math.e, math.exp(-1.0), 1.0]]))
    assert torch.allclose(w.weight, t([[1.0, 2.0, 0.0, 1.0]]))
    assert w.outlier.tolist() == [[False, False, True, False]]


def test_sequence_level_rho_sums_the_log_differences():
    w = train_infer_weight(t([[0.1, 0.2, 9.0]]), t([[0.0, 0.0, 0.0]]), t([[1.0, 1.0, 0.0]]), "sequence",
                           cap=None, mask_high=1.5)
    assert math.isclose(float(w.rho), math.exp(0.3), rel_tol=1e-12) and float(w.weight) == float(w.rho)
    w = train_infer_weight(t([[0.5, 0.5]]), t([[0.0, 0.0]]), t([[1.0, 1.0]]), "sequence", mask_high=1.5)
    assert float(w.weight) == 0.0 and bool(w.outlier)  # e^1 > 1.5


def test_k3_by_hand():
    # d = ref - logp = log 2: e^d - d - 1 = 2 - ln 2 - 1
    assert math.isclose(float(k3_kl(t(0.0), t(math.log(2.0)))), 1.0 - math.log(2.0), rel_tol=1e-12)
    assert float(k3_kl(t(-0.7), t(-0.7))) == 0.0


def test_normalisations_by_hand():
    per_token = t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = t([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    # token: (1 + 2 + 4 + 5 + 6) / 5 tokens
    assert float(loss_sum(per_token, mask, "token")) / loss_units(mask, "token") == pytest.approx(18 / 5)
    # sequence: (3/2 + 15/3) / 2 sequences
    assert float(loss_sum(per_token, mask, "sequence")) / loss_units(mask, "sequence") == pytest.approx(6.5 / 2)
    # constant: 18 / (2 sequences x L = 4)
    assert float(loss_sum(per_token, mask, "constant")) / loss_units(mask, "constant", 4) == pytest.approx(18 / 8)
    # a (B, 1) sequence-level term broadcasts over each row's tokens
    assert float(loss_sum(t([[2.0], [1.0]]), mask, "token")) == pytest.approx(2 * 2 + 1 * 3)


def test_token_normalisation_over_split_microbatches_equals_one_batch():
    gen = torch.Generator().manual_seed(0)
    per_token = torch.randn(6, 5, generator=gen, dtype=F64)
    mask = (torch.rand(6, 5, generator=gen) > 0.3).to(F64)
    whole = loss_sum(per_token, mask, "token") / loss_units(mask, "token")
    units = sum(loss_units(mask[i:i + 2], "token") for i in range(0, 6, 2))
    parts = sum(loss_sum(per_token[i:i + 2], mask[i:i + 2], "token") for i in range(0, 6, 2)) / units
    assert torch.allclose(whole, parts)


def test_rho_correction_recovers_exact_advantage_when_logprobs_match():
    """Train, old and rollout log-probs equal: rho and the ratio are exactly 1, each token's loss is exactly -A, and
    the gradient is the plain policy gradient -A m / units (the on-policy advantage, uncorrected and unclipped)."""
    gen = torch.Generator().manual_seed(1)
    lp = -torch.rand(3, 4, generator=gen, dtype=F64) * 3
    mask = t([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    adv = t([0.7, -1.3, 0.2])
    logp = lp.clone().requires_grad_(True)
    cfg = GrpoLossConfig(rho_cap=2.0, rho_mask_low=0.5, rho_mask_high=2.0)
    terms = policy_terms(logp, lp, lp.clone(), adv, mask, cfg)
    assert torch.equal(terms.weight.rho, torch.ones_like(lp)) and torch.equal(terms.weight.weight, torch.ones_like(lp))
    assert torch.equal(terms.ratio, torch.ones_like(lp))
    assert torch.equal(terms.per_token.detach(), -adv[:, None].expand_as(lp))
    (loss_sum(terms.per_token, mask, "token") / loss_units(mask, "token")).backward()
    assert torch.allclose(logp.grad, -adv[:, None] * mask / mask.sum(), atol=0, rtol=1e-15)


def test_policy_terms_compose_weight_and_kl_by_hand():
    logp = t([[-1.0]])
    old, roll, ref = t([[-1.2]]), t([[-1.2 - math.log(3.0)]]), t([[-1.0 + math.log(2.0)]])
    cfg = GrpoLossConfig(clip_low=0.2, clip_high=0.28, rho_cap=2.0, kl_beta=0.1)
    terms = policy_terms(logp, old, roll, t([1.0]), t([[1.0]]), cfg, ref)
    # r = e^0.2 = 1.2214 (< 1.28: unclipped) -> -1.2214; rho = 3 -> capped 2; kl = 2 - ln 2 - 1
    expected = -math.exp(0.2) * 2.0 + 0.1 * (1.0 - math.log(2.0))
    assert math.isclose(float(terms.per_token), expected, rel_tol=1e-12)


def test_config_refuses_bad_values():
    with pytest.raises(ValueError, match="dual_clip"):
        GrpoLossConfig(dual_clip=1.1)
    with pytest.raises(ValueError, match="rho_mask_low"):
        GrpoLossConfig(rho_mask_low=2.0, rho_mask_high=1.0)
    with pytest.raises(ValueError, match="kl_beta"):
        policy_terms(t([[0.0]]), t([[0.0]]), t([[0.0]]), t([1.0]), t([[1.0]]), GrpoLossConfig(kl_beta=0.1))
