"""The PPO critic's values. The critic itself is `align.train.rm_module.critic_from_policy` (the reward model's
start: a `MistralForValueHead` on the start checkpoint's trunk, lm_head dropped, a fresh score head from a seeded
generator), so PPO's critic and the reward model begin the same way.

`completion_values` gives the critic's value at the positions that predict each completion token: V_t is the value
of the state before token t is sampled (TRL PPO's layout: the value model's output at context_length - 1 + t)."""

from __future__ import annotations

import torch

from align.model.mistral import MistralForValueHead
from align.rl.token_logprobs import completion_rows, unflatten


def completion_values(critic: MistralForValueHead, batch: dict) -> torch.Tensor:
    """(N, C) fp32 values at the completion tokens' predicting positions, zeros outside `completion_mask`; only the
    (N_real, D) rows that predict a completion token go through the score head."""
    hidden, _, mask = completion_rows(critic, batch)
    return unflatten(critic.score(hidden).squeeze(-1).float(), mask)
