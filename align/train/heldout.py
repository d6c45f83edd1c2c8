"""`HeldoutPerplexity`: mean next-token NLL and perplexity on a fixed held-out slice, inside the training loop.

The slice is a list of batches built once (the pretraining corpus's held-out documents, align.data.token_order
`heldout_batches`); its NLL is the TrainModule's own loss sums (`ce_sum` / `tokens`) computed through `module.net`
without gradients, so every rank runs the same forwards (FSDP gathers need every rank) and gets the same number.
Evaluated before the first step (`before`), every `every` steps and at the last step; the history gets the columns
`heldout_nll` and `heldout_ppl` on every row (null between evaluations: the history's columns are fixed)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from align.train.callbacks import Callback


@dataclass(frozen=True)
class HeldoutConfig:
    """[heldout] table."""

    every: int = 50  # optimizer steps between evaluations (0: only before the first and after the last step)
    max_windows: int = 32  # held-out instances evaluated (the first ones, in document order)
    batch_size: int = 8

    def __post_init__(self):
        if self.every < 0 or self.max_windows < 1 or self.batch_size < 1:
            raise ValueError("heldout: every >= 0, max_windows >= 1 and batch_size >= 1 are required")


def heldout_nll(module, batches: list[dict]) -> float:
    """Mean next-token NLL (nats per label token) of the module's model on `batches`."""
    ce, tokens = 0.0, 0.0
    with torch.no_grad():
        for batch in batches:
            sums = module.net(batch).sums
            ce += float(sums["ce_sum"])
            tokens += float(sums["tokens"])
    return ce / tokens


class HeldoutPerplexity(Callback):
    name = "heldout"

    def __init__(self, batches: list[dict], every: int, max_steps: int):
        self.batches, self.every, self.max_steps = batches, every, max_steps
        self.before: float | None = None
        self.last: float | None = None

    def on_fit_start(self, trainer) -> None:
        if trainer.step == 0 and self.before is None:
            self.before = heldout_nll(trainer.module, self.batches)

    def observe(self, trainer, metrics: dict) -> None:
        due = trainer.step == self.max_steps or (self.every and trainer.step % self.every == 0)
        nll = heldout_nll(trainer.module, self.batches) if due else None
        if nll is not None:
            self.last = nll
        metrics["heldout_nll"] = nll
        metrics["heldout_ppl"] = math.exp(nll) if nll is not None else None
        return None

    def state_dict(self) -> dict:
        return {"before": self.before, "last": self.last}

    def load_state_dict(self, state: dict) -> None:
        self.before, self.last = state.get("before"), state.get("last")
