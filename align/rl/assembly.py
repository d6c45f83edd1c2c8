"""Groups of scored samples -> the tensor layout of align.rl.types -> optimizer-step windows of micro-batches.

Pure functions: the same groups, advantages and seed give the same windows, bit for bit (resume relies on it).

Several optimizer steps per rollout ("minibatches", seed 003 2.7): the rollout's rows are put in a seeded order
(mixing prompts across steps), cut into `num_minibatches` equal windows, and each window into micro-batches of
`micro_batch_size` rows after sorting it by length (less padding); with `epochs` > 1 the whole rollout is passed
over again in a fresh order (TRL's num_iterations, PPO's epochs). With one window the policy ratio is exactly 1 at
the first and only step and the PPO clip never binds; with several, steps 2.. train on data from older weights and
the clip does its job."""

from __future__ import annotations

from typing import Literal, Sequence

import torch

from align.inference.sequence import derive_seed
from align.rl.types import ROW_KEYS, TOKEN_KEYS, Group


def _pad_rows(rows: Sequence[Sequence], width: int, dtype: torch.dtype, fill=0) -> torch.Tensor:
    out = torch.full((len(rows), width), fill, dtype=dtype)  # shape: (N, width)
    for i, r in enumerate(rows):
        if len(r):
            out[i, :len(r)] = torch.tensor(list(r), dtype=dtype)
    return out


def assemble(groups: Sequence[Group], advantages: torch.Tensor,
             truncated: Literal["mask", "keep"] = "mask") -> dict[str, torch.Tensor]:
    """One batch of every sample of `groups` (group order, then sample order); advantages (P, G)."""
    samples = [s for g in groups for s in g.samples]
    if not samples:
        raise ValueError("assemble: no samples")
    comps = [s.completion_ids for s in samples]
    full = [tuple(s.prompt_ids) + tuple(s.completion_ids) for s in samples]
    c_width = max(1, max(len(c) for c in comps))
    mask = _pad_rows([[1.0] * len(c) for c in comps], c_width, torch.float32)
    cut = torch.tensor([float(s.reward.truncated) for s in samples])
    loss_mask = mask * (1.0 - cut)[:, None] if truncated == "mask" else mask.clone()
    extra = {}
    if any(s.policy_mask is not None for s in samples):  # an environment's observation tokens never train
        own = [s.policy_mask if s.policy_mask is not None else [1.0] * len(s.completion_ids) for s in samples]
        extra["policy_mask"] = _pad_rows(own, c_width, torch.float32)
        loss_mask = loss_mask * extra["policy_mask"]
    roll = _pad_rows([s.rollout_logprobs for s in samples], c_width, torch.float32)
    return {**extra,
        "input_ids": _pad_rows(full, max(len(f) for f in full), torch.int64),
        "completion_start": torch.tensor([len(s.prompt_ids) for s in samples], dtype=torch.int64),
        "completion_ids": _pad_rows(comps, c_width, torch.int64),
        "completion_mask": mask, "loss_mask": loss_mask, "rollout_logprobs": roll, "old_logprobs": roll.clone(),
        "advantages": advantages.reshape(-1).float(),
        "rewards": torch.tensor([s.reward.total for s in samples], dtype=torch.float32),
        "correct": torch.tensor([float(s.reward.correct) for s in samples]),
        "truncated": cut,
        "weight_version": torch.tensor([s.weight_version for s in samples], dtype=torch.int64),
        "prompt_row": torch.tensor([s.prompt_row for s in samples], dtype=torch.int64),
    }


def select_rows(batch: dict, rows: torch.Tensor) -> dict:
    """The batch restricted to `rows`, trimmed to the longest kept sequence and completion (no all-pad columns)."""
    out = {k: v.index_select(0, rows) for k, v in batch.items() if torch.is_tensor(v)}
    c = int(out["completion_mask"].sum(1).max().clamp(min=1))
    t = int((out["completion_start"] + out["completion_mask"].sum(1).long()).max())
    out["input_ids"] = out["input_ids"][:, :t].contiguous()
    for key in TOKEN_KEYS:
        if key in out:
            out[key] = out[key][:, :c].contiguous()
    return out


def plan_windows(lengths: torch.Tensor, num_minibatches: int, micro_batch_size: int, seed: int,
                 epochs: int = 1) -> list[list[torch.Tensor]]:
    """Row indices of `epochs x num_minibatches` windows (optimizer steps), each a list of micro-batches: every
    epoch a fresh seeded order of all rows, cut into equal minibatches, each sorted by length (less padding)."""
    n = lengths.shape[0]
    if n % num_minibatches:
        raise ValueError(f"plan_windows: {n} rows do not split into {num_minibatches} equal minibatches")
    windows = []
    for epoch in range(epochs):
        order = torch.randperm(n, generator=torch.Generator().manual_seed(derive_seed(seed, epoch)))
        for part in order.chunk(num_minibatches):
            part = part[torch.sort(lengths[part], descending=True, stable=True).indices]
            windows.append(list(part.split(micro_batch_size)))
    return windows


def row_lengths(batch: dict) -> torch.Tensor:
    return batch["completion_start"] + batch["completion_mask"].sum(1).long()


def split_windows(batch: dict, num_minibatches: int, micro_batch_size: int, seed: int,
                  epochs: int = 1) -> list[list[dict]]:
    """The planned windows' micro-batches (see plan_windows)."""
    plan = plan_windows(row_lengths(batch), num_minibatches, micro_batch_size, seed, epochs)
    return [[select_rows(batch, rows) for rows in window] for window in plan]


def window_seed(seed: int, rollout: int) -> int:
    return derive_seed(seed, rollout, 7)


def check_layout(batch: dict) -> None:
    """Refuse a micro-batch whose tensors disagree on N or C (a bug upstream, named here rather than in autograd)."""
    n, c = batch["completion_ids"].shape
    for key in TOKEN_KEYS:
        if key in batch and tuple(batch[key].shape) != (n, c):
            raise ValueError(f"GRPO batch: {key} has shape {tuple(batch[key].shape)}, expected {(n, c)}")
    for key in ROW_KEYS:
        if key in batch and batch[key].shape[0] != n:
            raise ValueError(f"GRPO batch: {key} has {batch[key].shape[0]} rows, expected {n}")
