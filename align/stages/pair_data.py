"""What the stages that train on preference shards (align.stages.dpo, align.stages.rm) share: the `[data]` keys
that place the pairs and hold some out, the `[model]` dtype table, the held-out split and the training subset, the
held-out batches and the receipt's last-window summary. One module both import, so neither stage imports the other."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Literal

import numpy as np

from align.data.collate import collate
from align.data.store import ShardSet
from align.exceptions import ConfigError
from align.train.ref_cache import length_sorted_rows
from align.utils.fsio import sha256_bytes
from align.utils.tracking import read_history


@dataclass(frozen=True)
class PairDataConfig:
    """The `[data]` keys every pair-training stage has (a stage's own table adds its inputs); paths under <runs>."""

    pairs: str = "shards/preference/out"
    heldout_every: int = 10  # rows with row % N == 0 are held out for evaluation; 0: none (no held-out metrics)
    eval_batch_pairs: int = 32
    threads: int = 0  # torch CPU threads; 0: every core

    def __post_init__(self):
        if self.heldout_every < 0 or self.heldout_every == 1:
            raise ValueError(f"heldout_every must be 0 or >= 2, got {self.heldout_every}")
        if self.eval_batch_pairs < 1:
            raise ValueError(f"eval_batch_pairs must be >= 1, got {self.eval_batch_pairs}")


@dataclass(frozen=True)
class ModelDtypeConfig:
    """[model] table: the dtype the trained model's parameters are held in (bf16 pairs with adamw8bit)."""

    dtype: Literal["float32", "bfloat16"] = "float32"


class RowSubset:
    """The rows `rows` of a ShardSet renumbered 0..n-1, so a BatchLoader reads only them (the training pairs).
    A batch's pair_index is then the subset position; `rows[pair_index]` is the shard-set (cache) row."""

    def __init__(self, parent: ShardSet, rows: np.ndarray):
        self.parent, self.rows = parent, np.asarray(rows, dtype=np.int64)
        self.path, self.kind, self.seqs_per_row = parent.path, parent.kind, parent.seqs_per_row
        self.manifest, self.tokenizer_hash = parent.manifest, parent.tokenizer_hash
        self.digest = sha256_bytes(parent.digest.encode() + self.rows.tobytes())  # binds a resume to the subset
        self.row_lengths = parent.row_lengths[self.rows]
        self.row_loss_tokens = parent.row_loss_tokens[self.rows]
        self.mixture = None if parent.mixture is None else parent.mixture.subset(self.rows)  # a mixture's sources

    def __len__(self) -> int:
        return len(self.rows)

    def sequence(self, row: int, arm: int = 0):
        return self.parent.sequence(int(self.rows[row]), arm)

    def meta(self, row: int) -> dict:
        return self.parent.meta(int(self.rows[row]))


def split_rows(n: int, every: int) -> tuple[np.ndarray, np.ndarray]:
    """(training rows, held-out rows) of n pairs: row % every == 0 is held out (none when every == 0)."""
    rows = np.arange(n, dtype=np.int64)
    held = rows % every == 0 if every else np.zeros(n, dtype=bool)
    if not (~held).any():
        raise ConfigError(f"data.heldout_every = {every} leaves no training pairs out of {n}")
    return rows[~held], rows[held]


def heldout_batches(shards: ShardSet, rows: np.ndarray, batch_pairs: int) -> Iterator[dict]:
    """The pairs `rows` as collated batches of up to `batch_pairs`, length-sorted (little padding). Every rank must
    score every batch (FSDP: the forward is collective)."""
    for plan in length_sorted_rows(shards.row_lengths[rows], batch_pairs):
        yield collate(shards, rows[plan])


def train_summary(run_dir: Path, keys: tuple[str, ...]) -> dict:
    """The last logged window's `keys` (training batches) as `train_<key>` ('/' -> '_') and its step, for a receipt."""
    rows = read_history(run_dir / "history.jsonl")
    last = rows[-1] if rows else {}
    return {"steps": last.get("step", 0), **{f"train_{k.replace('/', '_')}": last.get(k) for k in keys}}
