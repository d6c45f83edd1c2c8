"""align.rl.ppo.gae against GAE's non-recursive definition and torch's own statistics.

The references here are the closed forms: A_t = sum_l (gamma lambda)^l delta_{t+l}; lambda = 1 is the discounted
return minus V; whitening matches torch.mean / torch.var (unbiased) of the masked entries. The installed TRL (1.x)
no longer ships PPO's GAE or `masked_whiten`; tests/ppo/test_ppo_trl024_oracle.py checks both against TRL 0.24's
PPOTrainer on a real rollout (and says how TRL's value mask, one position past the response, maps onto `gae`)."""

from __future__ import annotations

import pytest
import torch

from align.rl.ppo.gae import GaeConfig, gae, masked_var, scale_negatives, whiten


def _batch(seed=0, b=4, t=9):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(b, t, generator=g, dtype=torch.float64)
    values = torch.randn(b, t, generator=g, dtype=torch.float64)
    lengths = [t, 5, 1, 7][:b]
    mask = torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]
    return rewards, values, mask, lengths


def _closed_form(r, v, gamma, lam):
    """One unpadded row: delta with V after the end = 0, then the explicit sum over l."""
    n = len(r)
    nxt = torch.cat([v[1:], v.new_zeros(1)])
    delta = r + gamma * nxt - v
    return torch.stack([sum((gamma * lam) ** l * delta[t + l] for l in range(n - t)) for t in range(n)])


@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.9, 0.8), (0.99, 1.0), (1.0, 0.0)])
def test_gae_equals_the_closed_form_per_row(gamma, lam):
    rewards, values, mask, lengths = _batch()
    adv, ret = gae(rewards, values, mask, gamma, lam)
    for i, n in enumerate(lengths):
        ref = _closed_form(rewards[i, :n], values[i, :n], gamma, lam)
        assert torch.allclose(adv[i, :n], ref, atol=1e-12, rtol=0), i
        assert torch.allclose(ret[i, :n], ref + values[i, :n], atol=1e-12, rtol=0)
        assert not adv[i, n:].any() and not ret[i, n:].any()  # padding carries nothing


def test_lambda_one_is_discounted_return_minus_value():
    rewards, values, mask, lengths = _batch(seed=1)
    gamma = 0.9
    adv, ret = gae(rewards, values, mask, gamma, 1.0)
    for i, n in enumerate(lengths):
        for t in range(n):
            g_t = sum(gamma ** k * rewards[i, t + k] for k in range(n - t))
            assert abs(ret[i, t] - g_t) < 1e-12 and abs(adv[i, t] - (g_t - values[i, t])) < 1e-12


def test_padding_values_do_not_leak():
    rewards, values, mask, _ = _batch(seed=2)
    noisy = values.masked_fill(~mask, 1e6)
    a1, r1 = gae(rewards, values, mask, 1.0, 0.95)
    a2, r2 = gae(rewards.masked_fill(~mask, -1e6), noisy, mask, 1.0, 0.95)
    assert torch.equal(a1, a2) and torch.equal(r1, r2)


def test_whiten_matches_torch_statistics():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 8, generator=g, dtype=torch.float64) * 3 + 2
    mask = torch.rand(3, 8, generator=g) > 0.3
    sel = x[mask]
    assert torch.allclose(masked_var(x, mask), sel.var(), atol=1e-12)
    w = whiten(x, mask, eps=0.0)
    assert torch.allclose(w[mask], (sel - sel.mean()) / sel.std(), atol=1e-12)
    assert not w[~mask].any()
    kept = whiten(x, mask, shift_mean=False, eps=0.0)
    assert torch.allclose(kept[mask], (sel - sel.mean()) / sel.std() + sel.mean(), atol=1e-12)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="share one"):
        gae(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3, dtype=torch.bool), 1.0, 1.0)
    with pytest.raises(ValueError, match="at least 2"):
        whiten(torch.zeros(1, 3), torch.tensor([[True, False, False]]))
    with pytest.raises(ValueError, match="lam"):
        GaeConfig(lam=1.5)
    with pytest.raises(ValueError, match="negative_scale"):
        GaeConfig(negative_scale=-0.1)


def test_scale_negatives_scales_only_the_negative_entries():
    adv = torch.tensor([[1.5, -2.0, 0.0], [-0.5, 0.25, -4.0]])
    assert torch.equal(scale_negatives(adv, 0.25), torch.tensor([[1.5, -0.5, 0.0], [-0.125, 0.25, -1.0]]))
    assert torch.equal(scale_negatives(adv, 0.0), adv.clamp(min=0.0))
    assert scale_negatives(adv, 1.0) is adv
