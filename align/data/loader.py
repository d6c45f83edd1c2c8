"""`BatchLoader`: the batches a training stage reads, sharded by rank, exactly resumable.

The global stream: each epoch's rows in a seeded order (align.data.order), cut into micro-batches (fixed size or a
token budget); the epochs follow each other without a gap. Optimizer step `s` consumes the G = world_size x
grad_accum micro-batches at global positions [s*G, (s+1)*G); rank r takes positions s*G + a*world_size + r for
a = 0..grad_accum-1. So the ranks' micro-batches are disjoint by construction and together are the whole stream
(every epoch covered exactly once); every rank takes the same number of steps (a step that runs past the end of an
epoch takes its last micro-batches from the next epoch's order), so no rank waits on a collective forever.

NOTE: the seed-000 bug (every rank received the same stream, so N ranks averaged N identical gradients) cannot
happen silently: `rank` and `world_size` default to torchrun's RANK / WORLD_SIZE, and values that contradict them
(or an initialised process group) are refused.

Resume: `state_dict()` after a step is consumed is {seed, epoch, offset (micro-batches of that epoch consumed
globally), step, dataset digest, batching}; `load_state_dict` restarts at exactly that micro-batch.
Different world size on resume: the global order is re-derived, never refused. The stream of micro-batches does not
depend on the world size, so the run continues at the same global position; if world_size x grad_accum is
unchanged every later optimizer step sees the same micro-batches as the uninterrupted run (the split across ranks
differs). A change of the data, the seed or the batching (micro_batch_size, max_tokens, pad_to_multiple, shuffle)
is refused: it would silently change the order.

Mixtures: a shard set built from several sources (align.data.shard_build, a `[mixtures.<split>]` of shards.toml)
carries their row ranges and weights; an epoch is then each source's share of `epoch_rows` rows, drawn from its own
seeded permutation and cycled up to `max_repetition` (align.data.mixture, the pretraining mixture's rule), in one
seeded order. The cursor, the rank split and resume are unchanged; a state also binds the mixture's weights.

Packing (`packing = "greedy" | "ffd"`, SFT shard sets only): the unit of a micro-batch becomes a packed row of
`seq_len` tokens holding several whole conversations (align.data.packing decides which, per epoch, from the seeded
order); `micro_batch_size` counts packed rows. The cursor, the rank split and resume are the same as above, over
packed micro-batches. A conversation longer than `seq_len` is refused when the loader is built (never split, never
silently dropped: the shard build's `encoding.max_len` is where over-long rows are dropped or truncated, counted in
its manifest)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator, Literal

import numpy as np

from align.config import to_dict
from align.data.collate import collate, collate_packed
from align.data.order import epoch_order, micro_batch_starts, round_up
from align.data.packing import pack
from align.data.store import ShardSet
from align.exceptions import ArtifactError, ConfigError

STATE_VERSION = 1


@dataclass(frozen=True)
class LoaderConfig:
    """Batching of one training stage. Rows are records (a pair counts as one row)."""

    micro_batch_size: int = 8  # rows per micro-batch; with max_tokens, the most rows a micro-batch may hold
    grad_accum: int = 1  # micro-batches per rank per optimizer step
    max_tokens: int | None = None  # token budget: padded tokens of a micro-batch (rows x width x arms) <= this
    shuffle: bool = True
    pad_to_multiple: int = 1  # padded width rounded up to this (8 or 64 helps GPU kernels)
    pad_id: int = 0  # id written under attention_mask False (never attended, never a label)
    num_epochs: int | None = None  # None: an endless stream (the trainer's step budget stops it)
    # sft only: several whole conversations per row of seq_len tokens (greedy: next-fit in stream order; ffd:
    # first-fit decreasing, fuller rows); micro_batch_size then counts packed rows, pad_to_multiple is not used
    packing: Literal["none", "greedy", "ffd"] = "none"
    seq_len: int = 2048  # width of a packed row in tokens; every conversation must fit in one

    def __post_init__(self):
        for name in ("micro_batch_size", "grad_accum", "pad_to_multiple"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.seq_len < 2:
            raise ValueError(f"seq_len must be >= 2, got {self.seq_len}")
        if self.packing != "none" and self.max_tokens is not None:
            raise ValueError(f"max_tokens and packing = {self.packing!r} exclude each other: a packed micro-batch "
                             "is always micro_batch_size x seq_len tokens")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1 or unset, got {self.max_tokens}")
        if self.num_epochs is not None and self.num_epochs < 1:
            raise ValueError(f"num_epochs must be >= 1 or unset, got {self.num_epochs}")

    def batching(self) -> dict:
        """The fields that decide micro-batch boundaries: a resume must not change them."""
        out = {k: v for k, v in to_dict(self).items() if k not in ("grad_accum", "num_epochs", "pad_id")}
        if self.packing == "none":  # a state saved before packing existed has neither key: it still resumes
            del out["packing"], out["seq_len"]
        return out


@dataclass(frozen=True)
class EpochPlan:
    """One epoch of the global stream. Unpacked, every batch row is one shard row (bin_starts = 0..n)."""

    rows: np.ndarray  # (n,) shard rows in stream order; a packed row's documents are consecutive
    bin_starts: np.ndarray  # (batch rows + 1,): batch row k holds rows[bin_starts[k]:bin_starts[k + 1]]
    starts: np.ndarray  # (micro-batches + 1,): micro-batch m holds batch rows [starts[m], starts[m + 1])

    def micro(self, m: int) -> list[np.ndarray]:
        """Micro-batch m as its batch rows, each an array of shard rows."""
        edges = self.bin_starts[self.starts[m]:self.starts[m + 1] + 1]
        return [self.rows[lo:hi] for lo, hi in zip(edges[:-1].tolist(), edges[1:].tolist())]


@dataclass(frozen=True)
class StepBatch:
    """One optimizer step's data for this rank, with the global totals a token- or row-normalised loss needs."""

    micro_batches: list[dict]
    step: int
    epoch: int  # epoch of this step's first micro-batch
    global_rows: int  # rows in the whole step, all ranks
    global_loss_tokens: int  # loss-mask tokens in the whole step, all ranks (0 for prompts)


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """The (rank, world_size) to shard by, checked against torchrun's environment and the process group."""
    env_rank, env_world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    facts: dict[str, tuple[int, int]] = {}
    if env_rank is not None and env_world is not None:
        facts["RANK/WORLD_SIZE"] = (int(env_rank), int(env_world))
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            facts["process group"] = (dist.get_rank(), dist.get_world_size())
    except ImportError:  # pragma: no cover - torch is a runtime dependency
        pass
    default = next(iter(facts.values()), (0, 1))
    chosen = (default[0] if rank is None else rank, default[1] if world_size is None else world_size)
    for source, fact in facts.items():
        if fact != chosen:
            raise ConfigError(f"data loader: told rank {chosen[0]} of {chosen[1]}, but the {source} says rank "
                              f"{fact[0]} of {fact[1]}; every rank would read the wrong part of the data")
    if not 0 <= chosen[0] < chosen[1]:
        raise ConfigError(f"data loader: rank {chosen[0]} outside [0, {chosen[1]})")
    return chosen


class BatchLoader:
    """Iterate `StepBatch`es for this rank. See the module docstring for the order, sharding and resume rules."""

    def __init__(self, shards: ShardSet, cfg: LoaderConfig, seed: int, rank: int | None = None,
                 world_size: int | None = None):
        self.shards, self.cfg, self.seed = shards, cfg, seed
        self.rank, self.world_size = resolve_rank(rank, world_size)
        self.epoch, self.offset, self.step = 0, 0, 0
        if len(shards) == 0:
            raise ArtifactError(f"{shards.path}: the shard set has no rows")
        self._lengths = shards.row_lengths
        self._mixture = shards.mixture
        if self._mixture is not None:
            self._mixture.epoch_rows_of(seed, 0)  # a mixture asking for more than max_repetition fails here, not later
        self._loss_tokens = shards.row_loss_tokens
        if cfg.max_tokens is not None:
            widest = int(self._lengths.max())
            if round_up(widest, cfg.pad_to_multiple) * shards.seqs_per_row > cfg.max_tokens:
                row = int(self._lengths.argmax())
                raise ConfigError(f"loader.max_tokens = {cfg.max_tokens} is below row {row} of {shards.path} "
                                  f"({widest} tokens): no micro-batch could hold it")
        if cfg.packing != "none":
            self._check_packing()
        self._plan_cache: dict[int, EpochPlan] = {}

    def _check_packing(self) -> None:
        """Packing needs single-sequence SFT rows that each fit a packed row; refuse anything else up front."""
        cfg, shards = self.cfg, self.shards
        if shards.kind != "sft":
            raise ConfigError(f"loader.packing = {cfg.packing!r} packs SFT conversations; {shards.path} holds "
                              f"{shards.kind!r} rows. Set loader.packing = \"none\" for this stage")
        too_long = np.flatnonzero(self._lengths > cfg.seq_len)
        if too_long.size:
            row = int(self._lengths.argmax())
            raise ConfigError(
                f"loader.seq_len = {cfg.seq_len} is shorter than {too_long.size} conversation(s) of {shards.path} "
                f"(the longest: row {row}, {int(self._lengths[row])} tokens); packing never splits a conversation. "
                f"Raise loader.seq_len to at least {int(self._lengths[row])}, or rebuild the shards with "
                f"build.encoding.max_len = {cfg.seq_len} (too_long = \"drop\" or \"truncate\", counted in the "
                f"shard manifest)")

    # ---- the global stream ---------------------------------------------------------------------------------------

    def _plan(self, epoch: int) -> EpochPlan:
        """The epoch's plan; the two most recent epochs are cached."""
        if epoch not in self._plan_cache:
            cfg = self.cfg
            if self._mixture is None:
                order = epoch_order(len(self.shards), self.seed, epoch, cfg.shuffle)
            else:  # a mixture split: each source's share of the epoch, repeats allowed (align.data.mixture)
                order = self._mixture.order(self.seed, epoch, cfg.shuffle)
            lengths = self._lengths[order]
            if cfg.packing == "none":
                bins = np.arange(len(order) + 1, dtype=np.int64)
                starts = micro_batch_starts(lengths, cfg.micro_batch_size, cfg.max_tokens, cfg.pad_to_multiple,
                                            self.shards.seqs_per_row)
            else:
                positions, bins = pack(lengths, cfg.seq_len, cfg.packing, self.seed, epoch)
                order = order[positions]
                starts = micro_batch_starts(np.diff(bins), cfg.micro_batch_size, None)
            self._plan_cache = {e: p for e, p in self._plan_cache.items() if e >= epoch - 1}
            self._plan_cache[epoch] = EpochPlan(order, bins, starts)
        return self._plan_cache[epoch]

    def micro_batches_in_epoch(self, epoch: int) -> int:
        return len(self._plan(epoch).starts) - 1

    def _global_step(self, epoch: int, offset: int) -> tuple[list[list[np.ndarray]], int, int]:
        """The next G micro-batches from (epoch, offset), each as its batch rows, and the cursor after them."""
        out = []
        for _ in range(self.world_size * self.cfg.grad_accum):
            if offset == self.micro_batches_in_epoch(epoch):
                epoch, offset = epoch + 1, 0
            out.append(self._plan(epoch).micro(offset))
            offset += 1
        return out, epoch, offset

    def _collate(self, batch_rows: list[np.ndarray]) -> dict:
        cfg = self.cfg
        if cfg.packing != "none":
            return collate_packed(self.shards, batch_rows, cfg.seq_len, cfg.pad_id)
        return collate(self.shards, np.concatenate(batch_rows), cfg.pad_id, cfg.pad_to_multiple)

    def __iter__(self) -> Iterator[StepBatch]:
        while self.cfg.num_epochs is None or self.epoch < self.cfg.num_epochs:
            micro, epoch, offset = self._global_step(self.epoch, self.offset)
            mine = micro[self.rank::self.world_size]  # position a*world_size + r within the step
            every = np.concatenate([rows for mb in micro for rows in mb])
            batch = StepBatch(micro_batches=[self._collate(mb) for mb in mine], step=self.step, epoch=self.epoch,
                              global_rows=len(every), global_loss_tokens=int(self._loss_tokens[every].sum()))
            # advance before yielding: state_dict() taken after the step was trained resumes at the next one
            self.epoch, self.offset, self.step = epoch, offset, self.step + 1
            if offset == self.micro_batches_in_epoch(epoch):
                self.epoch, self.offset = epoch + 1, 0
            yield batch

    def epoch_stats(self, epoch: int = 0) -> dict:
        """Shape of one epoch: documents, batch rows, micro-batches, real and padded tokens, the padding share."""
        plan, arms = self._plan(epoch), self.shards.seqs_per_row
        tokens = int(self.shards.manifest["tokens"])
        if self._mixture is not None and arms == 1:  # rows repeat or are left out: the epoch's own tokens
            tokens = int(self._lengths[plan.rows].sum())
        batch_rows = np.diff(plan.starts)
        if self.cfg.packing != "none":
            padded = int(batch_rows.sum()) * self.cfg.seq_len
        else:
            widest = np.maximum.reduceat(self._lengths[plan.rows], plan.starts[:-1])
            widths = -(-widest // self.cfg.pad_to_multiple) * self.cfg.pad_to_multiple
            padded = int((batch_rows * widths).sum()) * arms
        if self._mixture is not None and arms > 1:  # a pair's arms are not kept apart per row: no exact total
            tokens = None
        return {"documents": len(plan.rows), "batch_rows": int(batch_rows.sum()), "micro_batches": len(batch_rows),
                "tokens": tokens, "padded_tokens": padded,
                "padding_fraction": None if tokens is None else 1.0 - tokens / padded}

    # ---- resume --------------------------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        state = {"version": STATE_VERSION, "seed": self.seed, "epoch": self.epoch, "offset": self.offset,
                 "step": self.step, "dataset": self.shards.digest, "rows": len(self.shards),
                 "batching": self.cfg.batching(), "world_size": self.world_size, "grad_accum": self.cfg.grad_accum}
        if self._mixture is not None:  # the weights live in the manifest, not in the files the digest covers
            state["mixture"] = self._mixture.identity()
        return state

    def load_state_dict(self, state: dict) -> None:
        """Continue exactly where `state` was taken (any world size; see the module docstring)."""
        if state.get("version") != STATE_VERSION:
            raise ArtifactError(f"loader state version {state.get('version')!r}, this code reads {STATE_VERSION}")
        checks = (("dataset", state["dataset"], self.shards.digest, "the shard set differs"),
                  ("seed", state["seed"], self.seed, "the seed differs"),
                  ("batching", state["batching"], self.cfg.batching(), "micro-batch boundaries would differ"),
                  ("mixture", state.get("mixture"), None if self._mixture is None else self._mixture.identity(),
                   "the sources' shares of an epoch would differ"))
        for name, saved, current, why in checks:
            if saved != current:
                raise ArtifactError(f"loader state: {name} was {saved!r}, now {current!r} ({why}); resuming would "
                                    f"not continue the same data order. Start a fresh run or restore the {name}.")
        if not 0 <= state["offset"] <= self.micro_batches_in_epoch(state["epoch"]):
            raise ArtifactError(f"loader state: offset {state['offset']} outside epoch {state['epoch']}")
        self.epoch, self.offset, self.step = state["epoch"], state["offset"], state["step"]
