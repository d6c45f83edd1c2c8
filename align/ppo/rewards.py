"""PPO's per-token rewards: the outcome score at each completion's last token, minus beta times the KL to the frozen
reference on every token when the KL lives in the reward ([ppo] kl_in = "reward").

For completion i with score s_i (align.rl.rewards.CompositeReward's total: the verifier's outcome and the configured
terms), mask m (1 on sampled tokens), the policy's log-probs at the rollout's weights logp and the reference's ref:
    kl_it = logp_it - ref_it                                  (k1, TRL PPO's default estimator; its sum over the
                                                               sampled tokens is an unbiased estimate of the KL)
    r_it  = -beta * kl_it * m_it + s_i * [t = last sampled token of i]
A completion with no token gets no reward (there is no position to carry it, and no loss token either)."""

from __future__ import annotations

import torch


def token_rewards(scores: torch.Tensor, mask: torch.Tensor, logp: torch.Tensor, ref_logp: torch.Tensor | None,
                  beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """scores (N,), mask / logp / ref_logp (N, C) -> (rewards (N, C), kl_it (N, C), zero without a reference)."""
    m = mask.float()
    if beta > 0 and ref_logp is None:
        raise ValueError("token_rewards: beta > 0 needs the reference's log-probs")
    kl = (logp.float() - ref_logp.float()) * m if ref_logp is not None else torch.zeros_like(m)
    rewards = -beta * kl
    last = m.sum(1).long() - 1
    rows = torch.nonzero(last >= 0).squeeze(1)
    rewards[rows, last[rows]] += scores.float()[rows]
    return rewards, kl
