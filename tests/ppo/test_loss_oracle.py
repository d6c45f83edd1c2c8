"""Oracle: PPO's clipped surrogate with per-token advantages and the entropy bonus equal TRL's code on the same tensors,
value and gradient to 1e-6.

The installed TRL (1.x) ships no PPO trainer; GAE, `masked_whiten`, the clipped value loss and PPO's own policy loss
are checked against TRL 0.24's PPOTrainer in tests/ppo/test_ppo_trl024_oracle.py (TRL 0.24 beside the venv, run in
a subprocess). What TRL 1.x does ship is the same policy objective: GRPOTrainer._compute_loss takes advantages of shape (B, T) ("to support
subclasses that provide advantages with shape (B, T)"), and with a symmetric clip eps and loss_type "bnpo" (mean over
the batch's tokens) its loss is PPO's L_pi = mean_t max(-A_t r_t, -A_t clip(r_t, 1 - eps, 1 + eps)); its entropy
bonus subtracts coef * mean_t H_t, as align.rl.ppo.loss.entropy_bonus adds -coef * mean_t H_t. TRL's model call is
replaced by returning the given log-probs and entropies (tests/rl/test_grpo_loss_oracle.trl_loss): everything after
it is TRL's own code."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from align.rl.ppo.loss import entropy_bonus, policy_loss

sys.path.insert(0, str(Path(__file__).parent.parent / "rl"))
pytestmark = pytest.mark.oracle
pytest.importorskip("trl.trainer.grpo_trainer")
from test_grpo_loss_oracle import inputs_for, trl_loss  # noqa: E402  (TRL's call, shared with the GRPO oracle)

B, C = 4, 6


def tensors(seed: int):
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, C, generator=gen) * 2.0
    old = logp + 0.5 * torch.randn(B, C, generator=gen)  # ratios far from 1: the clip binds on both sides
    adv = torch.randn(B, C, generator=gen)  # per-token advantages, as GAE gives
    entropy = torch.rand(B, C, generator=gen) * 3.0
    mask = torch.ones(B, C)
    mask[0, 4:] = 0
    mask[2, 2:] = 0
    return logp, old, adv, entropy, mask


@pytest.mark.parametrize("seed,clip,entropy_coef", [(0, 0.2, 0.0), (1, 0.1, 0.0), (2, 0.2, 0.01), (3, 0.3, 0.5)])
def test_ppo_policy_loss_and_entropy_bonus_match_trl(seed, clip, entropy_coef):
    logp, old, adv, entropy, mask = tensors(seed)
    a, ha = logp.clone().requires_grad_(True), entropy.clone().requires_grad_(True)
    loss, frac = policy_loss(a, old, adv, mask, clip)
    mine = loss + entropy_bonus(ha, mask, entropy_coef)
    mine.backward()
    b, hb = logp.clone().requires_grad_(True), entropy.clone().requires_grad_(True)
    theirs = trl_loss(b, inputs_for(old, old, mask, adv), loss_type="bnpo", eps=(clip, clip), entropies=hb,
                      entropy_coef=entropy_coef)
    theirs.backward()
    assert 0 < float(frac) < 1  # some tokens take the clipped arm, some do not
    assert mine.item() == pytest.approx(theirs.item(), abs=1e-6, rel=1e-6)
    assert torch.allclose(a.grad, b.grad, atol=1e-6, rtol=1e-6)
    if entropy_coef:
        assert torch.allclose(ha.grad, hb.grad, atol=1e-6, rtol=1e-6) and ha.grad.abs().sum() > 0
