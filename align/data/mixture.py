"""Weighted mixtures of sources: which items of each source one epoch uses.

One rule serves the pretraining order (documents weighted by their tokens, align.data.token_order) and the chat
splits (shard rows, align.data.loader: SFT, preference pairs, prompts):

    Source s gets a target of w_s / sum(w) x B units of the epoch (B: the epoch's budget). It contributes items from
    its own seeded permutation of its items (align.data.order, salted by the source's index), in that order, cycling
    when they run out, until the target is reached (the item that reaches it is taken). A source cycled more than
    `max_repetition` times in one epoch is refused: that mixture asks for more than the data holds.

Everything is a pure function of (seed, epoch, the sources' items and sizes, the weights), so every rank derives the
same epoch and a resumed run re-derives it (world-size invariant, like align.data.order). With unit sizes (rows) a
source's count per epoch is ceil(target): its realised share is within 1/B of its target, whatever the seed.

`MixtureConfig` is a split's `[mixtures.<split>]` table in shards.toml; `RowMixture` is what a shard set built from
one records (align.data.shard_build) tells its loader: the row ranges of its sources and their weights."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from align.data.order import epoch_order
from align.exceptions import ConfigError

SOURCE_SALT = 0x4D495854  # "MIXT": a source's item permutation is not the epoch order's stream


@dataclass(frozen=True)
class MixtureConfig:
    """[mixtures.<split>]: a split drawn from several sources (ingest names, or records directories under runs)."""

    sources: dict[str, float] = field(default_factory=dict)  # source -> weight (its share: weight / sum)
    max_repetition: float = 4.0  # most times one source's rows may be used within one epoch
    epoch_rows: int | None = None  # rows per epoch; None: all the sources' rows together

    def __post_init__(self):
        if not self.sources:
            raise ValueError("a mixture needs at least one source (sources = { <name> = <weight>, ... })")
        for name, weight in self.sources.items():
            if not weight > 0:
                raise ValueError(f"mixture source {name!r}: weight must be > 0, got {weight}")
        if not self.max_repetition > 0:
            raise ValueError(f"max_repetition must be > 0, got {self.max_repetition}")
        if self.epoch_rows is not None and self.epoch_rows < 1:
            raise ValueError(f"epoch_rows must be >= 1 or unset, got {self.epoch_rows}")


def source_picks(members: list[np.ndarray], sizes: np.ndarray, weights: tuple[float, ...], names: tuple[str, ...],
                 budget: float, max_repetition: float, seed: int, epoch: int, unit: str = "rows",
                 shuffle: bool = True) -> list[np.ndarray]:
    """Per source, the items (indices into `sizes`) epoch `epoch` takes, in the source's own order (see the module
    docstring). `members[s]` are source s's items; `unit` names what `sizes` count, for the error."""
    total_w = sum(weights)
    picks = []
    for s, (name, weight, own) in enumerate(zip(names, weights, members)):
        target = weight / total_w * budget
        held = int(sizes[own].sum())
        if held == 0:
            raise ConfigError(f"mixture: source {name!r} has no {unit}")
        perm = own[epoch_order(len(own), seed ^ SOURCE_SALT ^ s, epoch, shuffle)]
        passes = max(1, int(np.ceil(target / held)))
        if passes > max_repetition:
            raise ConfigError(f"mixture: source {name!r} has {held} {unit}, its weight asks for {target:.0f} per "
                              f"epoch ({passes} passes > max_repetition = {max_repetition}); lower its weight or the "
                              "epoch's size, or add data")
        cycled = np.tile(perm, passes)
        cum = np.cumsum(sizes[cycled])
        picks.append(cycled[: int(np.searchsorted(cum, target)) + 1])
    return picks


def shares(picks: list[np.ndarray], sizes: np.ndarray) -> list[float]:
    """Each source's realised share of the epoch, in the unit of `sizes`."""
    amounts = [float(sizes[p].sum()) for p in picks]
    total = sum(amounts)
    return [a / total for a in amounts]


@dataclass(frozen=True)
class RowMixture:
    """The sources of a shard set's rows: source s holds rows `members[s]` (a mixture build writes them source by
    source, so each is a contiguous range; a row subset renumbers them)."""

    names: tuple[str, ...]
    weights: tuple[float, ...]
    members: tuple[np.ndarray, ...]
    max_repetition: float
    epoch_rows: int

    @classmethod
    def from_manifest(cls, entry: dict) -> RowMixture:
        """From a shard manifest's `mixture` field (align.data.shard_build)."""
        bounds = np.cumsum([0] + [s["rows"] for s in entry["sources"]])
        members = tuple(np.arange(lo, hi, dtype=np.int64) for lo, hi in zip(bounds[:-1], bounds[1:]))
        return cls(tuple(s["name"] for s in entry["sources"]), tuple(float(s["weight"]) for s in entry["sources"]),
                   members, float(entry["max_repetition"]), int(entry["epoch_rows"]))

    def subset(self, rows: np.ndarray) -> RowMixture:
        """The mixture over `rows` of this shard set renumbered 0..len(rows)-1; the epoch shrinks in proportion."""
        members = tuple(np.flatnonzero(np.isin(rows, m)).astype(np.int64) for m in self.members)
        total = sum(len(m) for m in self.members)
        epoch_rows = max(1, round(self.epoch_rows * len(rows) / total))
        return RowMixture(self.names, self.weights, members, self.max_repetition, epoch_rows)

    def epoch_rows_of(self, seed: int, epoch: int, shuffle: bool = True) -> list[np.ndarray]:
        """Per source, the rows epoch `epoch` takes."""
        sizes = np.ones(sum(len(m) for m in self.members), dtype=np.int64)
        return source_picks(list(self.members), sizes, self.weights, self.names, self.epoch_rows,
                            self.max_repetition, seed, epoch, "rows", shuffle)

    def order(self, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
        """(epoch_rows',) the rows of epoch `epoch` in training order (repeats allowed): the picks of every source,
        in one seeded permutation."""
        rows = np.concatenate(self.epoch_rows_of(seed, epoch, shuffle))
        return rows[epoch_order(len(rows), seed, epoch, shuffle)]

    def identity(self) -> dict:
        """What the order depends on beyond the rows: a loader state is bound to it."""
        return {"names": list(self.names), "weights": list(self.weights), "max_repetition": self.max_repetition,
                "epoch_rows": self.epoch_rows, "rows": [len(m) for m in self.members]}


def describe(names: tuple[str, ...], weights: tuple[float, ...], rows: list[int], max_repetition: float,
             epoch_rows: int) -> dict:
    """A shard manifest's `mixture` field: per source its rows, weight, target and realised share of an epoch (by
    rows: the same for every seed and epoch), and how many times its rows are used."""
    mixture = RowMixture.from_manifest({"sources": [{"name": n, "rows": r, "weight": w}
                                                    for n, r, w in zip(names, rows, weights)],
                                        "max_repetition": max_repetition, "epoch_rows": epoch_rows})
    counts = [len(p) for p in mixture.epoch_rows_of(0, 0)]
    total_w, total = sum(weights), sum(counts)
    return {"unit": "rows", "epoch_rows": epoch_rows, "max_repetition": max_repetition, "sources": [
        {"name": n, "rows": r, "weight": w, "target_share": w / total_w, "epoch_rows": c,
         "realised_share": c / total, "repetition": c / r} for n, r, w, c in zip(names, rows, weights, counts)]}
