"""The BPE merge loop, exactly as `tokenizers` orders it: repeatedly apply the adjacent pair with the lowest merge
rank, the leftmost one on ties, until no adjacent pair has a merge.

`tokenizers` (models/bpe/word.rs) keeps a heap of (rank, position) entries and drops stale ones; an entry whose
pair at that position still yields the same new token is always the identical pair (a symbol only grows to the
right and is never split), so "lowest (rank, position) among the current adjacent pairs" is the same order.
Two implementations of that order: a list scan (C-speed `min`, quadratic, best for ordinary words) and a heap
over a linked list (n log n, for long words such as a 10,000-character run).

Symbols are token ids. The merge table is one dict int -> int: key `left << ID_BITS | right`, value
`rank << ID_BITS | new_id`, so comparing values compares ranks (a rank belongs to one pair, hence one new id)
and no tuple or string is built in the loop.
"""

from __future__ import annotations

import heapq

ID_BITS = 21  # ids below 2**21 (2,097,152): larger than any BPE vocabulary in use
ID_MASK = (1 << ID_BITS) - 1
MergeTable = dict[int, int]

_NO_MERGE = 1 << 62
# Above this many symbols the quadratic scan loses to the heap (measured on 1-2k-symbol words).
HEAP_THRESHOLD = 160


def build_table(merges: list[tuple[int, int, int]]) -> MergeTable:
    """(left id, right id, new id) in rank order -> merge table. A repeated pair keeps its last rank, as the
    HashMap tokenizers builds from the same list does."""
    return {left << ID_BITS | right: rank << ID_BITS | new for rank, (left, right, new) in enumerate(merges)}


def merge(ids: list[int], table: MergeTable) -> list[int]:
    """Merge the initial symbols `ids` of one word (the list is modified) and return the final ids."""
    if len(ids) > HEAP_THRESHOLD:
        return merge_heap(ids, table)
    return merge_scan(ids, table)


def merge_scan(ids: list[int], table: MergeTable) -> list[int]:
    if len(ids) < 2:
        return ids
    get = table.get
    values = [get(a << ID_BITS | b, _NO_MERGE) for a, b in zip(ids, ids[1:])]
    while True:
        best = min(values)
        if best == _NO_MERGE:
            return ids
        i = values.index(best)  # first occurrence = leftmost among equal ranks
        new = best & ID_MASK
        ids[i:i + 2] = [new]
        del values[i]
        if i > 0:
            values[i - 1] = get(ids[i - 1] << ID_BITS | new, _NO_MERGE)
        if i < len(ids) - 1:
            values[i] = get(new << ID_BITS | ids[i + 1], _NO_MERGE)
        if not values:
            return ids


def merge_traced(ids: list[int], table: MergeTable, built: set[int]) -> list[int]:
    """`merge_scan`'s order (lowest rank, leftmost on ties) on a copy of `ids`, adding every symbol it holds to
    `built` (vocabulary trimming; not on the encode path)."""
    ids = list(ids)
    built.update(ids)
    get = table.get
    while len(ids) > 1:
        best, i = min((get(a << ID_BITS | b, _NO_MERGE), k) for k, (a, b) in enumerate(zip(ids, ids[1:])))
        if best == _NO_MERGE:
            break
        ids[i:i + 2] = [best & ID_MASK]
        built.add(best & ID_MASK)
    return ids


def merge_heap(ids: list[int], table: MergeTable) -> list[int]:
    n = len(ids)
    if n < 2:
        return ids
    get = table.get
    sym: list[int] = list(ids)
    alive = [True] * n
    nxt = list(range(1, n + 1))
    nxt[-1] = -1
    prv = list(range(-1, n - 1))
    heap = [(v, i) for i in range(n - 1) if (v := get(ids[i] << ID_BITS | ids[i + 1])) is not None]
    heapq.heapify(heap)
    while heap:
        value, i = heapq.heappop(heap)
        j = nxt[i]
        # NOTE: stale entries (a neighbour merged since the push) no longer match the pair now at i
        if not alive[i] or j == -1 or get(sym[i] << ID_BITS | sym[j]) != value:
            continue
        sym[i] = value & ID_MASK
        alive[j] = False
        k = nxt[j]
        nxt[i] = k
        if k != -1:
            prv[k] = i
        p = prv[i]
        if p != -1 and (v := get(sym[p] << ID_BITS | sym[i])) is not None:
            heapq.heappush(heap, (v, p))
        if k != -1 and (v := get(sym[i] << ID_BITS | sym[k])) is not None:
            heapq.heappush(heap, (v, i))
    return [s for s, keep in zip(sym, alive) if keep]
