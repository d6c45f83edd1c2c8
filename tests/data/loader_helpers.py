"""Shared helpers of the loader tests: take a number of steps, the global micro-batch stream of every rank,
round-trip a state dict as resume.pt does."""

from __future__ import annotations

import io
from typing import Callable

import torch

from align.data.loader import BatchLoader


def take(loader, steps: int) -> list:
    """The first `steps` StepBatches of `loader` (fewer if it runs dry)."""
    out = []
    for batch in loader:
        out.append(batch)
        if len(out) == steps:
            break
    return out


def global_stream(shards, cfg, world: int, steps: int, record: Callable[[int, dict], object],
                  seed: int = 7) -> list[list]:
    """Per step, `record(rank, micro_batch)` of every micro-batch in global position order (a * world + r),
    gathered from one loader per rank."""
    per_rank = [take(BatchLoader(shards, cfg, seed, rank=r, world_size=world), steps) for r in range(world)]
    stream = []
    for s in range(steps):
        step = [None] * (world * cfg.grad_accum)
        for r in range(world):
            for a, mb in enumerate(per_rank[r][s].micro_batches):
                step[a * world + r] = record(r, mb)
        stream.append(step)
    return stream


def roundtrip(state: dict) -> dict:
    """`state` after torch.save / torch.load(weights_only=True), as the trainer stores it inside resume.pt."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)
