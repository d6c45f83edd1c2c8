"""The PPO critic's values. The critic itself is `align.reward.rm_module.critic_from_policy` (the reward model's
start: a `MistralForValueHead` on the start checkpoint's trunk, lm_head dropped, a fresh score head from a seeded
generator), so PPO's critic and the reward model begin the same way.

`completion_values` gives the critic's value at the positions that predict each completion token: V_t is the value
of the state before token t is sampled (TRL PPO's layout: the value model's output at context_length - 1 + t).

`critic_net` is the module every value goes through: `completion_values` inside a `LossForward` unit (so FSDP2's
root unshards the embedding and the score head for it, as the policy's loss unit does), sharded with `fully_shard`
per decoder block like the policy when the policy is (strategy "fsdp" with several ranks: a 7B critic then holds
1/N of its weights, gradients and Adam state per rank, its gradients averaged by the reduce-scatter); otherwise
a plain unit over a replica (one process; or DDP, where PpoTrainModule averages the critic's gradients itself)."""

from __future__ import annotations

import torch
from torch import nn

from align.model.mistral import MistralForValueHead
from align.rl.token_logprobs import completion_rows, unflatten
from align.train.parallel import LossForward, ParallelConfig, wrap
from align.utils.dist import device, world_size


def completion_values(critic: MistralForValueHead, batch: dict) -> torch.Tensor:
    """(N, C) fp32 values at the completion tokens' predicting positions, zeros outside `completion_mask`; only the
    (N_real, D) rows that predict a completion token go through the score head."""
    hidden, _, mask = completion_rows(critic, batch)
    return unflatten(critic.score(hidden).squeeze(-1).float(), mask)


def critic_net(critic: MistralForValueHead, parallel: ParallelConfig) -> tuple[nn.Module, bool]:
    """(the unit whose forward(batch) gives `completion_values`, whether it is FSDP2-sharded). Build the critic's
    optimizer afterwards: sharding replaces its parameters with DTensors."""
    unit = LossForward(critic, completion_values)
    if parallel.resolved_strategy(world_size()) == "fsdp":
        return wrap(unit, parallel), True
    return unit.to(device()), False
