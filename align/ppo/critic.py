"""The PPO critic: `MistralForValueHead` (one value per token) whose trunk starts as the policy's start checkpoint
and whose score head is fresh (the model's own init rule, seeded), so values start near 0 and the critic reads the
same features the policy does from its first step.

`completion_values` gives the critic's value at the positions that predict each completion token: V_t is the value
of the state before token t is sampled (TRL PPO's layout: the value model's output at context_length - 1 + t)."""

from __future__ import annotations

import os

import torch

from align.exceptions import ConfigError
from align.model.checkpoint import load_weights_into, resolve_checkpoint_dir
from align.model.family import family_of_config
from align.model.hf_config import load_hf_config
from align.model.mistral import MistralForValueHead
from align.rl.token_logprobs import completion_rows, unflatten


def critic_from_policy(start: str | os.PathLike, seed: int, dtype: torch.dtype = torch.float32,
                       device="cpu") -> MistralForValueHead:
    """A value model on the policy's trunk: every `model.*` weight from `start`, `score` freshly initialised."""
    ckpt = resolve_checkpoint_dir(start)
    cfg = load_hf_config(ckpt)
    family = family_of_config(cfg)
    if MistralForValueHead not in family.models:
        raise ConfigError(f"{ckpt}: PPO's critic is a MistralForValueHead; the {family.name} family has no value "
                          f"model ({[m.__name__ for m in family.models]})")
    with torch.random.fork_rng(devices=[]):  # the critic's init must not move the run's RNG streams
        torch.manual_seed(seed)
        critic = MistralForValueHead(cfg)
    critic = critic.to(dtype=dtype, device=device)
    load_weights_into(critic, ckpt, ignore_missing=("score.",), ignore_unexpected=("lm_head.",))
    return critic


def completion_values(critic: MistralForValueHead, batch: dict) -> torch.Tensor:
    """(N, C) fp32 values at the completion tokens' predicting positions, zeros outside `completion_mask`."""
    hidden, _, mask = completion_rows(critic, batch)
    return unflatten(critic.score(hidden).squeeze(-1).float(), mask)
