"""Shared helpers of the loader tests: take a number of steps, round-trip a state dict as resume.pt does."""

from __future__ import annotations

import io

import torch


def take(loader, steps: int) -> list:
    """The first `steps` StepBatches of `loader` (fewer if it runs dry)."""
    out = []
    for batch in loader:
        out.append(batch)
        if len(out) == steps:
            break
    return out


def roundtrip(state: dict) -> dict:
    """`state` after torch.save / torch.load(weights_only=True), as the trainer stores it inside resume.pt."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)
