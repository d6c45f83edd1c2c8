"""Block manager and scheduler bookkeeping, without a model."""

from __future__ import annotations

from align.inference.block_manager import Admit, BlockManager
from align.inference.config import EngineConfig, SamplingParams
from align.inference.scheduler import Scheduler
from align.inference.sequence import Sequence

PARAMS = SamplingParams(temperature=0.0, max_new_tokens=8)


def seq(tokens, i=0, max_len=1000):
    return Sequence(i, list(tokens), PARAMS, seed=0, max_len=max_len)


def complete(bm: BlockManager, s: Sequence) -> None:
    """Pretend a step computed every token of s."""
    old = s.num_computed_tokens
    s.num_computed_tokens = s.num_tokens
    bm.mark_computed(s, old)


def test_chained_hashes_depend_on_the_whole_prefix():
    bm = BlockManager(8, 4)
    a = bm.block_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9])
    b = bm.block_hashes([0, 2, 3, 4, 5, 6, 7, 8])
    assert len(a) == 2 and len(b) == 2  # full blocks only
    assert a[0] != b[0] and a[1] != b[1]  # same second block, different prefix
    assert bm.block_hashes([1, 2, 3, 4, 5, 6, 7, 8]) == a


def test_shared_prefix_is_deferred_until_computed_then_shared():
    bm = BlockManager(16, 4)
    first, second = seq(range(10), 0), seq(range(10), 1)
    assert bm.admit(first) is Admit.OK and len(first.block_table) == 3
    assert bm.admit(second) is Admit.DEFER and second.block_table == []  # blocks exist but are not computed yet
    complete(bm, first)
    assert bm.admit(second) is Admit.OK
    assert second.block_table[:2] == first.block_table[:2] and second.block_table[2] != first.block_table[2]
    assert second.num_computed_tokens == 8 and bm.num_used_blocks == 4
    assert [bm.blocks[b].ref_count for b in first.block_table] == [2, 2, 1]


def test_fully_cached_prompt_copies_its_last_block():
    bm = BlockManager(16, 4)
    first, second = seq(range(8), 0), seq(range(8), 1)
    bm.admit(first)
    complete(bm, first)
    assert bm.admit(second) is Admit.OK
    assert second.block_table[0] == first.block_table[0] and second.block_table[1] != first.block_table[1]
    assert second.num_computed_tokens == 7  # the last token is recomputed into the private copy
    copies = bm.take_copies()
    assert copies == [(first.block_table[1], second.block_table[1])]
    bm.free_seq(first)
    assert bm.blocks[copies[0][0]].ref_count == 1  # the copy source stays pinned until the copy has run
    bm.release_copy_sources(copies)
    assert bm.blocks[copies[0][0]].ref_count == 0
    # the copy target is private: nobody can hit it through the prefix cache
    assert bm.hash_to_block[bm.block_hashes(list(range(8)))[1]] == copies[0][0]


def test_freed_blocks_stay_cached_until_reused_and_uncomputed_ones_are_forgotten():
    bm = BlockManager(4, 4)
    a = seq(range(8), 0)
    bm.admit(a)
    complete(bm, a)
    bm.free_seq(a)
    assert bm.num_free_blocks == 4
    b = seq(list(range(8)) + [99], 1)
    assert bm.admit(b) is Admit.OK and b.num_cached_tokens == 8  # hit after free
    bm.free_seq(b)
    c = seq(range(100, 116), 2)  # needs every block: evicts the cached ones
    assert bm.admit(c) is Admit.OK
    bm.free_seq(c)  # never computed: its hashes must not survive
    assert bm.hash_to_block == {} or all(bm.blocks[b].computed for b in bm.hash_to_block.values())
    d = seq(range(100, 116), 3)
    assert bm.admit(d) is Admit.OK and d.num_cached_tokens == 0


def test_no_space_and_reserve():
    bm = BlockManager(3, 4)
    a = seq(range(9), 0)  # 3 blocks
    assert bm.admit(a) is Admit.OK and bm.num_free_blocks == 0
    assert bm.admit(seq(range(50, 52), 1)) is Admit.NO_SPACE
    complete(bm, a)
    assert bm.reserve(a, 3)  # positions 9..11 fit in block 3
    assert not bm.reserve(a, 4)  # position 12 needs a 4th block


def test_scheduler_respects_the_token_budget_and_chunks_prefill():
    cfg = EngineConfig(block_size=4, max_num_batched_tokens=10, max_num_seqs=8)
    bm = BlockManager(32, 4)
    sched = Scheduler(cfg, bm)
    for i, n in enumerate((7, 12, 3)):
        sched.add(seq(range(100 * i, 100 * i + n), i))
    plan = sched.schedule()
    assert plan.num_tokens == [7, 3]  # the second prompt gets the 3 tokens left of the budget
    assert sched.advance(plan) == [plan.seqs[0]]  # only the first reached its last token
    plan.seqs[0].append_token(1, 0.0, 0.0)
    plan = sched.schedule()
    # decoding first (1 token), then the rest of the chunked prompt (9); no budget is left to admit the third
    assert [s.seq_id for s in plan.seqs] == [0, 1] and plan.num_tokens == [1, 9]
    assert [s.seq_id for s in sched.waiting] == [2]


def test_scheduler_preempts_the_newest_when_blocks_run_out():
    cfg = EngineConfig(block_size=2, max_num_batched_tokens=100, max_num_seqs=8)
    bm = BlockManager(4, 2)
    sched = Scheduler(cfg, bm)
    a, b = seq([1, 2], 0), seq([3, 4], 1)
    sched.add(a)
    sched.add(b)
    plan = sched.schedule()
    sched.advance(plan)
    for s in (a, b):
        s.append_token(5, 0.0, 0.0)
    bm_free = bm.num_free_blocks
    assert bm_free == 2
    plan = sched.schedule()  # each needs a new block for position 2: both fit
    sched.advance(plan)
    for s in (a, b):
        s.append_token(6, 0.0, 0.0)
    plan = sched.schedule()  # positions 3 fit in the same blocks
    sched.advance(plan)
    for s in (a, b):
        s.append_token(7, 0.0, 0.0)
    plan = sched.schedule()  # position 4: a new block each, none free: b (newest) is preempted for a
    assert [s.seq_id for s in plan.seqs] == [0] and sched.num_preemptions == 1
    assert list(sched.waiting) == [b] and b.num_computed_tokens == 0 and b.output_ids == [5, 6, 7]
