"""Sequence packing: an epoch's documents (SFT conversations) placed into bins of at most `seq_len` tokens, each bin
one row of a packed micro-batch. Pure functions of (the epoch's seeded row order, the row lengths, seq_len), so
every rank computes the same bins without talking to the others and a resumed run recomputes them exactly.

Two strategies:
- greedy (next-fit): walk the shuffled order, close the bin when the next document does not fit. Keeps the epoch's
  order exactly (a bin is a run of consecutive documents of the stream); wastes the tail of each bin.
- ffd (first-fit decreasing): documents by decreasing length (ties in stream order), each into the first bin with
  room. Fills bins almost completely (FFD uses at most 11/9 OPT + 6/9 bins); the bins are then put in a seeded order
  and the documents inside a bin in stream order, so neither the bin sequence nor a row's layout follows length.

A document longer than `seq_len` is never split (a split conversation would train its tail without the prompt);
the loader refuses such a shard set before packing (align.data.loader)."""

from __future__ import annotations

from typing import Literal

import numpy as np

from align.data.order import epoch_order

Strategy = Literal["greedy", "ffd"]
_BIN_ORDER_SALT = 0x5041434B  # "PACK": the bin order's permutation is not the row permutation's stream


def pack_greedy(lengths: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Next-fit over `lengths` (in stream order). Returns (positions (n,), bin_starts (n_bins + 1,)):
    bin k holds the documents at stream positions positions[bin_starts[k]:bin_starts[k + 1]]."""
    starts, fill = [0], 0
    for i, length in enumerate(lengths.tolist()):
        if fill and fill + length > seq_len:
            starts.append(i)
            fill = 0
        fill += length
    starts.append(len(lengths))
    return np.arange(len(lengths), dtype=np.int64), np.asarray(starts, dtype=np.int64)


def _first_fit(sizes: list[int], seq_len: int) -> list[int]:
    """The bin index of each size, first fit. A max-tree over every possible bin's free room (an unopened bin has
    seq_len free), so the leftmost bin with room is found in O(log n): O(n log n) for the epoch, not O(n x bins)."""
    leaves = 1
    while leaves < max(1, len(sizes)):
        leaves *= 2
    room = [seq_len] * (2 * leaves)  # room[1] is the root; leaves at [leaves, 2 * leaves)
    out = []
    for size in sizes:
        node = 1
        while node < leaves:  # descend to the leftmost child with room; the root has room (size <= seq_len)
            node = 2 * node if room[2 * node] >= size else 2 * node + 1
        out.append(node - leaves)
        room[node] -= size
        node //= 2
        while node:
            room[node] = max(room[2 * node], room[2 * node + 1])
            node //= 2
    return out


def pack_ffd(lengths: np.ndarray, seq_len: int, seed: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    """First-fit decreasing over `lengths` (in stream order); same return layout as `pack_greedy`."""
    n = len(lengths)
    by_size = np.lexsort((np.arange(n), -lengths))  # decreasing length, ties in stream order
    bins = np.empty(n, dtype=np.int64)
    bins[by_size] = _first_fit(lengths[by_size].tolist(), seq_len)
    n_bins = int(bins.max()) + 1 if n else 0
    rank_of_bin = np.empty(n_bins, dtype=np.int64)
    rank_of_bin[epoch_order(n_bins, seed ^ _BIN_ORDER_SALT, epoch)] = np.arange(n_bins)
    positions = np.lexsort((np.arange(n), rank_of_bin[bins]))  # bins in seeded order, documents in stream order
    counts = np.bincount(rank_of_bin[bins], minlength=n_bins)
    return positions.astype(np.int64), np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


def pack(lengths: np.ndarray, seq_len: int, strategy: Strategy, seed: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    """(positions, bin_starts) of one epoch; see `pack_greedy`. Every position appears exactly once."""
    if strategy == "greedy":
        return pack_greedy(lengths, seq_len)
    if strategy == "ffd":
        return pack_ffd(lengths, seq_len, seed, epoch)
    raise ValueError(f"packing strategy must be 'greedy' or 'ffd', got {strategy!r}")
