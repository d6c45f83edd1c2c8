"""Learning-rate schedules as pure functions of the optimizer step count.

A schedule here has no state of its own: the multiplier for step `s` is a function of `s` and the config alone, so a
resumed run that restores the step counter cannot drift from an uninterrupted one (a stateful torch LR scheduler
must have its own state restored in lockstep, and a skipped step must not advance it). The TrainModule applies
`base_lr * lr_multiplier(cfg, step, total_steps)` to every param group before each applied optimizer step; a
skipped step does not advance `step`.

Shapes (w = warmup_steps, T = total_steps, f = min_lr_ratio, s = applied steps so far, 0-based):
    warmup (all):  (s + 1) / w                    for s < w   (the first step already moves, at lr / w)
    constant:      1
    linear:        1 - (1 - f) * p                p = (s - w) / max(1, T - w), clamped to [0, 1]
    cosine:        f + (1 - f) * (1 + cos(pi p)) / 2
    wsd:           1 until the last `decay_fraction` of T, then linear from 1 to f over that tail
                   (warmup-stable-decay, Hu et al. 2024 "MiniCPM")."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class SchedulerConfig:
    """[scheduler] table: the learning-rate multiplier over optimizer steps."""

    name: Literal["constant", "linear", "cosine", "wsd"] = "cosine"
    warmup_steps: int = 0  # linear ramp from lr / warmup_steps to lr
    min_lr_ratio: float = 0.1  # f: the multiplier the decay ends at (lr floor = f * lr)
    decay_fraction: float = 0.2  # wsd only: fraction of the horizon spent in the final linear decay

    def __post_init__(self):
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must lie in [0, 1], got {self.min_lr_ratio}")
        if not 0.0 < self.decay_fraction <= 1.0:
            raise ValueError(f"decay_fraction must lie in (0, 1], got {self.decay_fraction}")


def lr_multiplier(cfg: SchedulerConfig, step: int, total_steps: int) -> float:
    """Multiplier of the base learning rate for the optimizer step that follows `step` applied steps."""
    if step < 0 or total_steps < 1:
        raise ValueError(f"need step >= 0 and total_steps >= 1, got {step}, {total_steps}")
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    f = cfg.min_lr_ratio
    if cfg.name == "constant":
        return 1.0
    if cfg.name == "wsd":
        decay_start = total_steps - max(1, round(cfg.decay_fraction * total_steps))
        decay_start = max(decay_start, cfg.warmup_steps)
        if step < decay_start:
            return 1.0
        p = min(1.0, (step - decay_start) / max(1, total_steps - decay_start))
        return 1.0 - (1.0 - f) * p
    p = min(1.0, (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps))
    if cfg.name == "linear":
        return 1.0 - (1.0 - f) * p
    if cfg.name == "cosine":
        return f + (1.0 - f) * 0.5 * (1.0 + math.cos(math.pi * p))
    raise ValueError(f"unknown schedule {cfg.name!r}")
