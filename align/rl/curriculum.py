"""`PromptCurriculum`: which prompt rows GRPO samples next, seeded, and resumable to the row.

Each epoch is a permutation of the prompt rows drawn from (seed, epoch) alone, so any epoch's order can be re-derived
after a restart. A prompt shard set built as a mixture (`[mixtures.<split>]`, its manifest's `mixture`) draws each
epoch by the mixture's weights instead: `RowMixture.order(seed, epoch)` (align.data.mixture, the rule the SFT/DPO
loader uses: each source's share of the epoch, its rows repeated or left out), again from (seed, epoch) alone.
With several ranks, rank r takes positions r, r + W, r + 2W, ... of every epoch (disjoint streams;
a top-up on one rank never shifts another's prompts).

    order "shuffle":   every epoch a fresh seeded permutation
    order "by_group":  the first `warm_epochs` epochs visit the rows group by group in ascending group order
                       (the bundled task's groups are difficulty levels 1-4: easy first), shuffled within a group;
                       later epochs shuffle everything
    skip_solved:       pass-rate memory: a prompt whose last group was solved by every sample is skipped until the
                       epoch after next (it gives no gradient; seed 003, "dynamic sampling ... pass-rate memory").
                       If every row is solved the memory is cleared rather than loop forever.

State (`state_dict`): epoch, offset (positions of this rank's stream consumed in that epoch), the solved rows and the
epoch each was solved in, and what the order depends on (seed, rows, config, and a mixture's weights and sources
when there is one); `load_state_dict` refuses a state taken over other rows, another seed or another mixture."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

import torch

from align.data.mixture import RowMixture
from align.exceptions import ArtifactError
from align.inference.sequence import derive_seed


@dataclass(frozen=True)
class CurriculumConfig:
    """[curriculum] table."""

    order: Literal["shuffle", "by_group"] = "shuffle"
    warm_epochs: int = 1  # epochs that follow the group order under "by_group"
    skip_solved: bool = False

    def __post_init__(self):
        if self.warm_epochs < 0:
            raise ValueError(f"CurriculumConfig.warm_epochs must be >= 0, got {self.warm_epochs}")


def _group_key(group: str) -> tuple:
    return (0, int(group), "") if group.lstrip("-").isdigit() else (1, 0, group)


class PromptCurriculum:
    def __init__(self, groups: Sequence[str], cfg: CurriculumConfig, seed: int, rank: int = 0, world_size: int = 1,
                 mixture: RowMixture | None = None):
        if not groups:
            raise ArtifactError("prompt curriculum: no prompt rows")
        if mixture is not None:
            held = sum(len(m) for m in mixture.members)
            if held != len(groups):
                raise ArtifactError(f"prompt curriculum: the mixture's sources hold {held} rows, the prompt set "
                                    f"{len(groups)}")
            mixture.epoch_rows_of(seed, 0)  # a mixture asking for more than max_repetition fails here, not later
        self.mixture = mixture
        self.groups, self.cfg, self.seed = list(groups), cfg, seed
        self.rank, self.world_size = rank, world_size
        self.epoch, self.offset = 0, 0
        self.solved: dict[int, int] = {}  # row -> epoch it was last solved in
        self._cache: tuple[int, list[int]] | None = None

    def epoch_order(self, epoch: int) -> list[int]:
        """The global order of epoch `epoch` (every rank derives the same)."""
        if self.mixture is not None:  # the sources' weighted shares of the epoch (rows may repeat)
            perm = self.mixture.order(self.seed, epoch).tolist()
        else:
            gen = torch.Generator().manual_seed(derive_seed(self.seed, epoch))
            perm = torch.randperm(len(self.groups), generator=gen).tolist()
        if self.cfg.order == "by_group" and epoch < self.cfg.warm_epochs:
            perm.sort(key=lambda row: _group_key(self.groups[row]))  # stable: shuffled within each group
        return perm

    def _stream(self, epoch: int) -> list[int]:
        if self._cache is None or self._cache[0] != epoch:
            self._cache = (epoch, self.epoch_order(epoch)[self.rank::self.world_size])
        return self._cache[1]

    def _skip(self, row: int) -> bool:
        solved_in = self.solved.get(row)
        return self.cfg.skip_solved and solved_in is not None and self.epoch <= solved_in + 1

    def take(self, n: int) -> list[int]:
        """The next `n` rows of this rank's stream (crossing epochs as needed)."""
        out: list[int] = []
        skipped_run = 0
        while len(out) < n:
            stream = self._stream(self.epoch)
            if self.offset >= len(stream):
                self.epoch, self.offset = self.epoch + 1, 0
                continue
            row = stream[self.offset]
            self.offset += 1
            if self._skip(row):
                skipped_run += 1
                if skipped_run > 2 * len(stream):  # everything is solved: forget and start using rows again
                    self.solved.clear()
                continue
            skipped_run = 0
            out.append(row)
        return out

    def record(self, row: int, solved: bool) -> None:
        """Pass-rate memory: remember (or forget) that every sample of `row`'s latest group was correct."""
        if solved:
            self.solved[row] = self.epoch
        else:
            self.solved.pop(row, None)

    # ---- resume -------------------------------------------------------------------------------------------------
    def _identity(self) -> dict:
        identity = {"seed": self.seed, "rows": len(self.groups), "order": self.cfg.order,
                    "warm_epochs": self.cfg.warm_epochs, "world_size": self.world_size}
        if self.mixture is not None:  # absent for one source: a plain set's state is what it was
            identity["mixture"] = self.mixture.identity()
        return identity

    def state_dict(self) -> dict:
        rows = sorted(self.solved)
        return {**self._identity(), "epoch": self.epoch, "offset": self.offset, "solved_rows": rows,
                "solved_epochs": [self.solved[r] for r in rows]}

    def load_state_dict(self, state: dict) -> None:
        mine = self._identity()
        for key in [*mine, *({"mixture"} - set(mine))]:  # a state with a mixture never resumes a set without one
            value = mine.get(key)
            if state.get(key) != value:
                raise ArtifactError(f"prompt curriculum state: {key} was {state.get(key)!r}, now {value!r}; resuming "
                                    f"would not continue the same prompt order")
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])
        self.solved = {int(r): int(e) for r, e in zip(state["solved_rows"], state["solved_epochs"])}
        self._cache = None
