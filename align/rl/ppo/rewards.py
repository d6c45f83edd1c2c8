"""PPO's per-token rewards: the outcome score at each completion's last token, minus beta times the KL to the frozen
reference on every token when the KL lives in the reward ([ppo] kl_in = "reward").

For completion i with score s_i (align.rl.rewards.CompositeReward's total: the verifier's outcome and the configured
terms), mask m (1 on sampled tokens), the policy's log-probs at the rollout's weights logp and the reference's ref:
    kl_it = logp_it - ref_it                                  (k1, TRL PPO's default estimator; its sum over the
                                                               sampled tokens is an unbiased estimate of the KL)
    r_it  = -beta * kl_it * m_it + s_i * [t = last sampled token of i]
A completion with no token gets no reward (there is no position to carry it, and no loss token either).

With a reward model ([reward] model, a Bradley-Terry critic from the `rm_checkpoint` rung), s_i = the composite
reward's total + model_weight * the model's score of prompt + completion (`reward_model_scorer`: the score head on
the last real token, align.reward.rm_module.sequence_rewards, as the model was trained)."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from align.reward.rm_module import sequence_rewards


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


def reward_model_scorer(model: nn.Module) -> Callable[[dict], torch.Tensor]:
    """A frozen reward model -> micro-batch (align.rl.types layout) -> (N,) fp32 scores of prompt + completion."""
    model.eval().requires_grad_(False)

    @torch.no_grad()
    def scorer(batch: dict) -> torch.Tensor:
        dev = model.score.weight.device
        ids = batch["input_ids"].to(dev)
        ends = (batch["completion_start"] + batch["completion_mask"].sum(1).long()).to(dev)  # (N,) real lengths
        attention = torch.arange(ids.shape[1], device=dev)[None, :] < ends[:, None]
        return sequence_rewards(model, ids, attention).cpu()

    return scorer
