"""`PromptSet`: what an RL batch source or an in-loop evaluation reads per prompt row. Its own module so that the
in-loop evaluation (imported by every training stage) does not pull GRPO's batch source, stage config and loss into
the SFT and DPO workers' code digests: an edit to GRPO's loss must rebuild GRPO alone."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from align.data.mixture import RowMixture


@dataclass
class PromptSet:
    """What the source reads per prompt row: token ids and gold answer (a ShardSet of kind "prompts" fits), and
    the row's metadata (id, group, gold: what a `python` reward term receives; None: {} for every row)."""

    ids: Callable[[int], tuple[int, ...]]
    gold: Callable[[int], str]
    groups: list[str]
    meta: Callable[[int], dict] | None = None
    mixture: RowMixture | None = None  # a mixture split's sources and weights: the RL prompt draw follows them


    @classmethod
    def from_shards(cls, shards) -> "PromptSet":
        metas = [shards.meta(r) for r in range(len(shards))]
        return cls(ids=lambda r: tuple(int(t) for t in shards.sequence(int(r))[0]),
                   gold=lambda r: metas[int(r)]["gold"], groups=[str(m["group"]) for m in metas],
                   meta=lambda r: dict(metas[int(r)]), mixture=shards.mixture)
