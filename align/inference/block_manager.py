"""KV-cache block allocation: fixed-size blocks, a block table per sequence, and a prefix cache of hashed blocks.

A full block of prompt tokens is named by a chained blake2b hash (the hash of the previous block, then this block's
tokens), so equal prefixes map to the same block. A sequence whose prefix is cached takes those blocks by reference
count instead of computing them: the G samples of one prompt prefill it once. A block is shared only once its K/V
are computed; a sequence that would hit a block another sequence is still computing is deferred (`DEFER`) for a
step rather than computing it twice. Freed blocks keep their hash and go to the back of the free list, so recently
used prefixes survive until the space is needed (LRU).

Continuation (`cache_generated`): a request that continues a finished sequence (a multi-turn episode's next turn:
prompt + the policy's turn + the environment's tokens, align.rl.environment) picks up its K/V where it stopped, as if
the sequence had been kept: (1) the blocks a sequence fills while it decodes join the cache once computed (a full
computed block is never written again, so sharing it is safe); (2) a finished sequence's last, partial block is
remembered as a tail, keyed by the chain hash before it and its computed tokens; a request whose tokens continue
them takes the block over (only while no one holds it: the new owner writes the rest of it) and starts computing
after them. So only the finished sequence's last sampled token and the new tokens are prefilled. The K/V taken over
are the decode steps', bitwise a prefill's under the engine's batch invariance with the native attention kernel
(head_dim and block_size multiples of 16; the torch attention path can round a log-prob's last bit differently).

The last token of a sequence is always run through the model (its logits are needed to sample). When the cache
covers every token, the last cached block is therefore copied into a private block (copy-on-write) and the
sequence recomputes only that one token into its copy; shared blocks are never written."""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, field

from align.inference.sequence import Sequence, SeqStatus


class Admit(enum.Enum):
    OK = "ok"
    DEFER = "defer"  # a prefix block it needs is being computed by another sequence: retry next step
    NO_SPACE = "no_space"


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: bytes | None = None  # set for full prompt blocks while they are (or may be) in the prefix cache
    computed: bool = False  # K/V written; only then may another sequence share it
    tail: tuple | None = None  # key in BlockManager.tails while it holds a finished sequence's partial last block


@dataclass
class BlockManager:
    num_blocks: int
    block_size: int
    enable_prefix_caching: bool = True
    cache_generated: bool = True  # continuation (module doc): decode-filled blocks and finished sequences' partial
    # last blocks are kept for a request that continues them (False: prompt blocks only, every turn prefilled again)
    blocks: list[Block] = field(init=False)
    free: dict[int, None] = field(init=False)  # insertion-ordered set: front = least recently freed
    hash_to_block: dict[bytes, int] = field(init=False)
    tails: dict[tuple, tuple[int, int]] = field(init=False)  # (chain hash before, tokens) -> (block, tokens computed)
    pending_copies: list[tuple[int, int]] = field(init=False)  # (src, dst) block copies for the next step
    num_cached_tokens: int = field(init=False, default=0)  # statistic: tokens admitted from the prefix cache

    def __post_init__(self):
        self.blocks = [Block(i) for i in range(self.num_blocks)]
        self.free = dict.fromkeys(range(self.num_blocks))
        self.hash_to_block = {}
        self.tails = {}
        self.pending_copies = []

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def block_hashes(self, tokens: list[int]) -> list[bytes]:
        """Chained hashes of every full block of `tokens`."""
        out, prev, bs = [], b"", self.block_size
        for start in range(0, len(tokens) - bs + 1, bs):
            h = hashlib.blake2b(prev, digest_size=16)
            h.update(b"".join(t.to_bytes(4, "little") for t in tokens[start:start + bs]))
            prev = h.digest()
            out.append(prev)
        return out

    def admit(self, seq: Sequence) -> Admit:
        """Give a waiting sequence blocks for all its current tokens, sharing cached prefix blocks."""
        hashes = self.block_hashes(seq.tokens) if self.enable_prefix_caching else []
        hits: list[int] = []
        for h in hashes:
            bid = self.hash_to_block.get(h)
            if bid is None:
                break
            if not self.blocks[bid].computed:
                return Admit.DEFER
            hits.append(bid)
        cow_src = hits.pop() if hits and len(hits) * self.block_size >= seq.num_tokens else None
        tail = self._find_tail(seq, hits, hashes) if cow_src is None else None
        num_new = self.blocks_for(seq.num_tokens) - len(hits) - (tail is not None)
        taken_from_free = sum(1 for b in hits if self.blocks[b].ref_count == 0)
        taken_from_free += cow_src is not None and self.blocks[cow_src].ref_count == 0
        taken_from_free += tail is not None
        if num_new + taken_from_free > len(self.free):
            return Admit.NO_SPACE
        for bid in hits:
            self._ref(bid)
        if tail is not None:  # the finished sequence's partial block, now this sequence's own (it writes the rest)
            self._drop_tail(self.blocks[tail[0]])
            self._ref(tail[0])
            if len(hits) < len(hashes):  # full once this sequence computes it: shared from then on
                self._register(tail[0], hashes[len(hits)])
            hits.append(tail[0])
        if cow_src is not None:
            # NOTE: the source keeps an extra reference until the copy has run, or a block taken below (or by a
            # later admission in the same step) could be this one, overwritten before it is copied.
            self._ref(cow_src)
        table = list(hits)
        for i in range(len(hits), len(hits) + num_new):  # (a tail block is in `hits` from here on)
            bid = self._take_free()
            table.append(bid)
            # The copy-on-write target is not registered: its last token is rewritten this step, and a block
            # that other sequences may share must never be written.
            if i < len(hashes) and not (cow_src is not None and i == len(hits)):
                self._register(bid, hashes[i])
        seq.block_table = table
        cached = len(hits) * self.block_size if tail is None else (len(hits) - 1) * self.block_size + tail[1]
        if cow_src is not None:
            self.pending_copies.append((cow_src, table[len(hits)]))
            cached = seq.num_tokens - 1
        seq.num_computed_tokens = seq.num_cached_tokens = cached
        self.num_cached_tokens += cached
        return Admit.OK

    def _find_tail(self, seq: Sequence, hits: list[int], hashes: list[bytes]) -> tuple[int, int] | None:
        """(block, tokens computed) of a free tail that seq's tokens continue right after its cached full blocks,
        leaving at least seq's last token to compute; None if there is none."""
        if not self.tails:
            return None
        start = len(hits) * self.block_size
        prev = hashes[len(hits) - 1] if hits else b""
        for m in range(min(self.block_size - 1, seq.num_tokens - 1 - start), 0, -1):
            found = self.tails.get((prev, tuple(seq.tokens[start:start + m])))
            if found is not None and self.blocks[found[0]].ref_count == 0:
                return found
        return None

    def _keep_tail(self, seq: Sequence) -> None:
        """Remember a finished sequence's partial last block for a request that continues it (module doc)."""
        bs, n = self.block_size, seq.num_computed_tokens
        k, m = divmod(n, bs)
        if m == 0 or k >= len(seq.block_table):
            return
        block = self.blocks[seq.block_table[k]]
        if block.ref_count != 1 or block.hash is not None:
            return
        prev = b"" if k == 0 else self.blocks[seq.block_table[k - 1]].hash
        if prev is None:
            prev = self.block_hashes(seq.tokens[:k * bs])[-1]
        key = (prev, tuple(seq.tokens[k * bs:n]))
        old = self.tails.get(key)
        if old is not None:
            self.blocks[old[0]].tail = None
        self.tails[key] = (block.block_id, m)
        block.tail = key

    def _drop_tail(self, block: Block) -> None:
        if block.tail is not None:
            if self.tails.get(block.tail, (None,))[0] == block.block_id:
                del self.tails[block.tail]
            block.tail = None

    def take_copies(self) -> list[tuple[int, int]]:
        """The (src, dst) copies the model runner must perform before the next forward."""
        copies, self.pending_copies = self.pending_copies, []
        return copies

    def release_copy_sources(self, copies: list[tuple[int, int]]) -> None:
        for src, _ in copies:
            self._unref(src)

    def reserve(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Make the block table cover `num_new_tokens` more computed tokens; False if the cache is full."""
        need = self.blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        if need > len(self.free):
            return False
        for _ in range(need):
            seq.block_table.append(self._take_free())
        return True

    def mark_computed(self, seq: Sequence, old_num_computed: int) -> None:
        """Publish the full blocks that the last step completed, so other sequences may share them."""
        bs = self.block_size
        for i in range(old_num_computed // bs, seq.num_computed_tokens // bs):
            block = self.blocks[seq.block_table[i]]
            block.computed = True
            if block.hash is None and self.enable_prefix_caching and self.cache_generated:
                h = self._chain_hash(seq, i)
                if h not in self.hash_to_block:  # an equal block already cached (a copy-on-write source) stays
                    self._register(block.block_id, h)

    def _chain_hash(self, seq: Sequence, i: int) -> bytes:
        """Block i's chained hash (`block_hashes`), from block i - 1's when that block carries it."""
        prev = self.blocks[seq.block_table[i - 1]].hash if i > 0 else b""
        if prev is None:  # a private copy, or a cache reset since admission: the chain from the tokens
            return self.block_hashes(seq.tokens[:(i + 1) * self.block_size])[-1]
        h = hashlib.blake2b(prev, digest_size=16)
        h.update(b"".join(t.to_bytes(4, "little") for t in seq.tokens[i * self.block_size:(i + 1) * self.block_size]))
        return h.digest()

    def free_seq(self, seq: Sequence) -> None:
        # The tail is freed first so it is reused first: a prompt's leading blocks are the likeliest to be hit again.
        if seq.status is SeqStatus.FINISHED and self.enable_prefix_caching and self.cache_generated:
            self._keep_tail(seq)  # not after a preemption or an abort: only a finished sequence is continued
        for bid in reversed(seq.block_table):
            self._unref(bid)
        seq.block_table = []

    # ------------------------------------------------------------------------------------------------ internals

    def _ref(self, bid: int) -> None:
        block = self.blocks[bid]
        if block.ref_count == 0:
            del self.free[bid]
        block.ref_count += 1

    def _unref(self, bid: int) -> None:
        block = self.blocks[bid]
        block.ref_count -= 1
        if block.ref_count == 0:
            if block.hash is not None and not block.computed:
                self._unregister(block)  # never computed: nobody may hit it
            self.free[bid] = None

    def _take_free(self) -> int:
        bid = next(iter(self.free))
        del self.free[bid]
        block = self.blocks[bid]
        if block.hash is not None:
            self._unregister(block)  # its old content is about to be overwritten
        self._drop_tail(block)
        block.ref_count, block.computed = 1, False
        return bid

    def _register(self, bid: int, h: bytes) -> None:
        old = self.hash_to_block.get(h)
        if old is not None:
            self.blocks[old].hash = None
        self.hash_to_block[h] = bid
        self.blocks[bid].hash = h

    def _unregister(self, block: Block) -> None:
        if self.hash_to_block.get(block.hash) == block.block_id:
            del self.hash_to_block[block.hash]
        block.hash = None

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (new weights make old K/V wrong). Blocks in use keep their contents."""
        for block in self.blocks:
            block.hash = block.tail = None
        self.hash_to_block.clear()
        self.tails.clear()
