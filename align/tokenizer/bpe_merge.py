"""The BPE merge loop, exactly as `tokenizers` orders it: repeatedly apply the adjacent pair with the lowest merge
rank, the leftmost one on ties, until no adjacent pair has a merge.

`tokenizers` (models/bpe/word.rs) keeps a heap of (rank, position) entries and drops stale ones; an entry whose
pair at that position still concatenates to the same piece is always the identical pair (a symbol only grows to
the right and is never split), so "lowest (rank, position) among the current adjacent pairs" is the same order.
Two implementations of that order: a list scan (C-speed `min`, quadratic, best for ordinary words) and a heap
over a linked list (n log n, for long words such as a 10,000-character run).
"""

from __future__ import annotations

import heapq

Ranks = dict[tuple[str, str], int]

_NO_MERGE = 1 << 62
# Above this many symbols the quadratic scan loses to the heap (measured on 1-2k-character words).
HEAP_THRESHOLD = 160


def merge(symbols: list[str], ranks: Ranks) -> list[str]:
    """Merge `symbols` (initial pieces of one word, modified in place) and return the final pieces."""
    if len(symbols) > HEAP_THRESHOLD:
        return merge_heap(symbols, ranks)
    return merge_scan(symbols, ranks)


def merge_scan(symbols: list[str], ranks: Ranks) -> list[str]:
    if len(symbols) < 2:
        return symbols
    get = ranks.get
    pair_ranks = [get(pair, _NO_MERGE) for pair in zip(symbols, symbols[1:])]
    while True:
        best = min(pair_ranks)
        if best == _NO_MERGE:
            return symbols
        i = pair_ranks.index(best)  # first occurrence = leftmost among equal ranks
        merged = symbols[i] + symbols[i + 1]
        symbols[i:i + 2] = [merged]
        del pair_ranks[i]
        if i > 0:
            pair_ranks[i - 1] = get((symbols[i - 1], merged), _NO_MERGE)
        if i < len(symbols) - 1:
            pair_ranks[i] = get((merged, symbols[i + 1]), _NO_MERGE)
        if not pair_ranks:
            return symbols


def merge_heap(symbols: list[str], ranks: Ranks) -> list[str]:
    n = len(symbols)
    if n < 2:
        return symbols
    get = ranks.get
    sym: list[str | None] = list(symbols)
    nxt = list(range(1, n + 1))
    nxt[-1] = -1
    prv = list(range(-1, n - 1))
    heap = [(r, i, symbols[i] + symbols[i + 1]) for i in range(n - 1)
            if (r := get((symbols[i], symbols[i + 1]))) is not None]
    heapq.heapify(heap)
    while heap:
        _, i, merged = heapq.heappop(heap)
        left = sym[i]
        j = nxt[i]
        if left is None or j == -1:
            continue
        right = sym[j]
        # NOTE: stale entries (a neighbour merged since the push) are recognised by their concatenation.
        if right is None or left + right != merged:
            continue
        sym[i] = merged
        sym[j] = None
        k = nxt[j]
        nxt[i] = k
        if k != -1:
            prv[k] = i
        p = prv[i]
        if p != -1 and (r := get((sym[p], merged))) is not None:
            heapq.heappush(heap, (r, p, sym[p] + merged))
        if k != -1 and (r := get((merged, sym[k]))) is not None:
            heapq.heappush(heap, (r, i, merged + sym[k]))
    return [s for s in sym if s is not None]
