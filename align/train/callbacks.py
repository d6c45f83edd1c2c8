"""Callbacks: what is not the loop (progress display, speed / MFU, tripwires) as small classes with named hooks.

Hooks, in the order the Trainer calls them at an optimizer-step boundary:
    observe(trainer, metrics) -> str | None   every rank, BEFORE the boundary's agreement: may add columns to
                                              `metrics` (global values) and may return a rank-local halt reason,
                                              which only counts after the MAX reduce (align.train.control)
    on_step_end(trainer, metrics)             every rank, after the agreement and the history row
    on_checkpoint_saved(trainer, path)        every rank, after a checkpoint is published
    on_fit_start(trainer) / on_fit_end(trainer, exit_code)
A callback with state that must survive resume implements state_dict / load_state_dict (saved per rank).
Every column a callback adds must be added on every step (NaN when unknown): history rows keep one column set."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from align.utils.dist import is_rank0
from align.utils.tracking import ProgressDisplay

if TYPE_CHECKING:  # pragma: no cover
    from align.train.trainer import Trainer


class Callback:
    name = "callback"

    def on_fit_start(self, trainer: "Trainer") -> None:
        pass

    def observe(self, trainer: "Trainer", metrics: dict) -> str | None:
        return None

    def on_step_end(self, trainer: "Trainer", metrics: dict) -> None:
        pass

    def on_checkpoint_saved(self, trainer: "Trainer", path) -> None:
        pass

    def on_fit_end(self, trainer: "Trainer", exit_code: int) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class SpeedMonitor(Callback):
    """`tokens_per_s` (non-pad input tokens, all ranks, over the step's wall time) and `mfu` from the 6*N*tokens
    approximation of training FLOPs (attention's T^2 term ignored), when the peak FLOP/s of the hardware is given."""

    name = "speed"

    def __init__(self, n_params: int, peak_flops_per_s: float | None = None):
        self.n_params, self.peak = n_params, peak_flops_per_s
        self._last = None

    def on_fit_start(self, trainer) -> None:
        self._last = time.perf_counter()

    def observe(self, trainer, metrics: dict) -> None:
        now = time.perf_counter()
        elapsed, self._last = now - (self._last or now), now
        tokens = metrics.get("input_tokens", math.nan)
        rate = tokens / elapsed if elapsed > 0 else math.nan
        metrics["step_s"] = elapsed
        metrics["tokens_per_s"] = rate
        metrics["mfu"] = 6.0 * self.n_params * rate / self.peak if self.peak else math.nan
        return None


class ProgressLine(Callback):
    """One progress line on rank 0 (steps, tok/s, loss, ETA): redrawn on a terminal, periodic in a log."""

    name = "progress"

    def __init__(self, total_steps: int, label: str = "", plain_every_s: float = 30.0):
        self.display = ProgressDisplay(total_steps, label=label, plain_every_s=plain_every_s) if is_rank0() else None

    def on_step_end(self, trainer, metrics: dict) -> None:
        if self.display is not None:
            tokens = metrics.get("input_tokens", 0)
            self.display.update(trainer.step, tokens=int(tokens) if math.isfinite(tokens) else 0,
                                loss=metrics.get("loss"))

    def on_fit_end(self, trainer, exit_code: int) -> None:
        if self.display is not None:
            self.display.close()
