"""`StepBatches`: the process reward model's training stream over encoded step-labelled solutions (in memory: a
few thousand short rows), as the Trainer consumes a loader: one list of micro-batches per optimizer step, a
seeded permutation per epoch, and a state_dict that resumes at the next step exactly (rm_process.collate_steps
makes each micro-batch)."""

from __future__ import annotations

import hashlib
from typing import Iterator

import torch

from align.exceptions import ArtifactError
from align.reward.rm_process import EncodedSteps, collate_steps


def rows_digest(rows: list[EncodedSteps]) -> str:
    h = hashlib.sha256()
    for r in rows:
        h.update(repr((r.ids, r.step_ends, r.labels)).encode())
    return h.hexdigest()[:16]


class StepBatches:
    def __init__(self, rows: list[EncodedSteps], micro_batch_size: int, grad_accum: int, seed: int,
                 pad_id: int = 0):
        if not rows:
            raise ValueError("StepBatches: no step-labelled rows to train on")
        if micro_batch_size < 1 or grad_accum < 1:
            raise ValueError(f"micro_batch_size and grad_accum must be >= 1, got {micro_batch_size}, {grad_accum}")
        self.rows, self.micro, self.accum, self.seed, self.pad_id = rows, micro_batch_size, grad_accum, seed, pad_id
        self.digest = rows_digest(rows)
        self.epoch, self.offset = 0, 0  # the next step starts at row `offset` of epoch `epoch`'s order

    def _order(self, epoch: int) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(len(self.rows), generator=g).tolist()

    def __iter__(self) -> Iterator[list[dict]]:
        step_rows = self.micro * self.accum
        while True:
            order = self._order(self.epoch)
            picked = order[self.offset:self.offset + step_rows]
            if len(picked) < step_rows:  # the epoch's tail is dropped: every step has the same number of rows
                self.epoch, self.offset = self.epoch + 1, 0
                continue
            # advance before yielding: a state_dict taken after the step was trained resumes at the next one
            self.offset += step_rows
            yield [collate_steps([self.rows[i] for i in picked[k:k + self.micro]], self.pad_id)
                   for k in range(0, step_rows, self.micro)]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "offset": self.offset, "seed": self.seed, "digest": self.digest,
                "micro_batch_size": self.micro, "grad_accum": self.accum}

    def load_state_dict(self, state: dict) -> None:
        for key, now in (("digest", self.digest), ("seed", self.seed), ("micro_batch_size", self.micro),
                         ("grad_accum", self.accum)):
            if state[key] != now:
                raise ArtifactError(f"StepBatches state: {key} was {state[key]!r}, now {now!r}; resuming would not "
                                    f"continue the same data order")
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])
