"""The KV cache kept across an episode's turns (align.inference.block_manager `cache_generated`): the blocks a
policy's turn fills while decoding, and its last partial block, serve the next turn's request, so the conversation
is not prefilled again. The same episodes (tokens and log-probs, bitwise, greedy and sampled) as the re-prefill path,
and exactly the tokens one sequence kept for the whole episode would compute."""

from __future__ import annotations

import pytest

from align.rl.environment import EpisodeStart, run_episodes

VOCAB, EOS = 64, 2
STOPS = tuple(range(4, VOCAB, 5))  # "newlines": a turn ends at one of these (greedy and sampled episodes both run
# several turns with this random policy)


STARTS = [EpisodeStart(tuple(range(20, 20 + 3 + i)), "", {}, seed=i) for i in range(6)]


@pytest.fixture(scope="module")
def episodes(tiny_policy, episode_client, answering_env):
    """episodes(keep, temperature) -> (episodes, engine stats): the random policy's episodes, each turn answered with
    7 plain tokens (a tool's output), with the kept cache on or off."""
    policy = tiny_policy(VOCAB, EOS, hidden_size=64, num_hidden_layers=2, max_position_embeddings=512)
    answers = answering_env("30 31 32 33 34 35 36")

    def run(keep: bool, temperature: float):
        client = episode_client(policy, max_model_len=512, block_size=16)
        client.engine.block_manager.cache_generated = keep
        eps = run_episodes(client, STARTS, answers, encode=lambda text: [int(t) for t in text.split()],
                           decode=lambda ids: " ".join(map(str, ids)), eos_id=EOS, newline_ids=STOPS,
                           temperature=temperature, max_tokens=200, max_turns=5)
        return eps, client.engine.stats

    return run


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_kept_cache_gives_the_same_episodes_and_prefills_less(episodes, temperature):
    kept, with_cache = episodes(True, temperature)
    again, without = episodes(False, temperature)
    assert kept == again  # tokens, masks, log-probs, finish reasons: bitwise
    assert sum(e.turns for e in kept) >= 6 and max(e.turns for e in kept) >= 5  # several requests an episode
    assert with_cache.generated_tokens == without.generated_tokens
    saved = without.computed_tokens - with_cache.computed_tokens
    assert saved > 0 and with_cache.cached_tokens - without.cached_tokens == saved  # served instead of computed
    # exactly what one sequence kept for the whole episode computes: every token of the conversation once, up to the
    # last sampled one (never run through the model; an observation appended after it was never sent)
    kept_sequence = sum(len(s.prompt_ids) + max(j for j, m in enumerate(e.policy_mask) if m == 1.0)
                        for s, e in zip(STARTS, kept))
    assert with_cache.computed_tokens == kept_sequence < without.computed_tokens


def test_a_tail_is_taken_over_once_and_forgotten_with_the_weights():
    """Block bookkeeping (no model): a finished sequence's partial last block goes to one continuation only (it
    writes the rest of the block), never while someone holds it; a preempted sequence leaves none; a cache reset
    (new weights) forgets them; and `cache_generated` False keeps none."""
    from align.inference.block_manager import Admit, BlockManager
    from align.inference.config import SamplingParams
    from align.inference.sequence import Sequence, SeqStatus

    def seq(tokens, i):
        return Sequence(i, list(tokens), SamplingParams(temperature=0.0, max_new_tokens=8), seed=0, max_len=100)

    def run_and_finish(bm, s, status=SeqStatus.FINISHED):
        assert bm.admit(s) is Admit.OK
        old, s.num_computed_tokens = s.num_computed_tokens, s.num_tokens - 1  # the last token: sampled, not run
        bm.mark_computed(s, old)
        s.status, table = status, list(s.block_table)
        bm.free_seq(s)
        return table

    bm = BlockManager(16, 4)
    first = seq(range(10), 0)  # blocks [0-3] [4-7] and a tail [8] (token 9 sampled last)
    table = run_and_finish(bm, first)
    assert len(bm.tails) == 1
    a, b = seq([*range(10), 50, 51], 1), seq([*range(10), 60], 2)
    assert bm.admit(a) is Admit.OK and a.num_computed_tokens == 9 and a.block_table[:3] == table
    assert not bm.tails and bm.admit(b) is Admit.OK and b.num_computed_tokens == 8  # taken: b recomputes token 8
    assert b.block_table[2] != a.block_table[2]
    for s in (a, b):
        s.status = SeqStatus.RUNNING
        bm.free_seq(s)  # as a preemption does: no tail kept
    assert not bm.tails
    run_and_finish(bm, seq(range(10), 3))
    assert len(bm.tails) == 1
    bm.reset_prefix_cache()
    assert not bm.tails and bm.admit(seq([*range(10), 50], 4)) is Admit.OK
    off = BlockManager(16, 4, cache_generated=False)
    run_and_finish(off, seq(range(10), 5))
    assert not off.tails and not off.hash_to_block.keys() - set(off.block_hashes(list(range(10))))
