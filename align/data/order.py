"""The global data order: a seeded permutation per epoch, cut into micro-batches, independent of the world size.

Everything here is a pure function of (seed, epoch, row lengths, batching config), so every rank computes the same
global sequence of micro-batches without talking to the others, and a resumed run recomputes it exactly.

The permutation sorts rows by a splitmix64 hash of (seed, epoch, row): written out in numpy so the order cannot
change under a numpy or torch upgrade (numpy's `Generator.permutation` stream is not promised stable across
releases)."""

from __future__ import annotations

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # uint64 arithmetic wraps modulo 2**64 by design
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def epoch_order(n_rows: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """(n_rows,) int64: the rows of `epoch` in training order (identity when not shuffling)."""
    rows = np.arange(n_rows, dtype=np.int64)
    if not shuffle:
        return rows
    with np.errstate(over="ignore"):
        salt = _splitmix64(np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))[0]
        salt = _splitmix64(np.array([salt ^ np.uint64(epoch)], dtype=np.uint64))[0]
        keys = _splitmix64(rows.astype(np.uint64) ^ salt)
    return np.argsort(keys, kind="stable").astype(np.int64)


def round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def micro_batch_starts(lengths: np.ndarray, micro_batch_size: int, max_tokens: int | None,
                       pad_to_multiple: int = 1, arms: int = 1) -> np.ndarray:
    """Boundaries (n_micro + 1,) of consecutive micro-batches over rows whose lengths (in order) are `lengths`.

    Fixed mode (`max_tokens` None): `micro_batch_size` rows each, the last one possibly shorter.
    Token-budget mode: greedy, a micro-batch grows while arms x rows x padded width (the tokens of the padded
    tensors: a preference pair has 2 arms) stays <= `max_tokens` and it has at most `micro_batch_size` rows. The
    caller checks that no single row exceeds the budget."""
    n = len(lengths)
    if max_tokens is None:
        return np.append(np.arange(0, n, micro_batch_size, dtype=np.int64), np.int64(n))
    starts, count, width = [0], 0, 0
    for i, length in enumerate(lengths.tolist()):
        new_width = max(width, round_up(length, pad_to_multiple))
        if count and (arms * (count + 1) * new_width > max_tokens or count + 1 > micro_batch_size):
            starts.append(i)
            count, new_width = 0, round_up(length, pad_to_multiple)
        count, width = count + 1, new_width
    starts.append(n)
    return np.asarray(starts, dtype=np.int64)
