"""The KV cache kept across an episode's turns (align.inference.block_manager `cache_generated`): the blocks a
policy's turn fills while decoding serve the next turn's request, so the conversation is not prefilled again. The
same episodes (tokens and log-probs, bitwise, greedy and sampled) as the re-prefill path, fewer tokens computed."""

from __future__ import annotations

import copy

import pytest
import torch

from align.inference import EngineConfig
from align.model import MistralConfig, MistralForCausalLM
from align.rl.environment import EnvStep, EpisodeStart, run_episodes
from align.rollout import RolloutConfig, make_rollout_client

VOCAB, EOS = 64, 2
STOPS = tuple(range(4, VOCAB, 5))  # "newlines": a turn ends at one of these (greedy and sampled episodes both run
# several turns with this random policy)


class Answers:
    """Answers every turn with 7 plain tokens (a tool's output)."""

    def reset(self, prompt, meta):
        pass

    def step(self, text):
        return EnvStep("30 31 32 33 34 35 36")

    def reward(self, completion):
        return 0.0


def model() -> MistralForCausalLM:
    torch.manual_seed(0)
    return MistralForCausalLM(MistralConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                            max_position_embeddings=512, eos_token_id=EOS))


def episodes(keep: bool, temperature: float):
    client = make_rollout_client(RolloutConfig(engine=EngineConfig(block_size=16, max_model_len=512)),
                                 copy.deepcopy(model()))
    client.engine.block_manager.cache_generated = keep
    starts = [EpisodeStart(tuple(range(20, 20 + 3 + i)), "", {}, seed=i) for i in range(6)]
    eps = run_episodes(client, starts, Answers, encode=lambda text: [int(t) for t in text.split()],
                       decode=lambda ids: " ".join(map(str, ids)), eos_id=EOS, newline_ids=STOPS,
                       temperature=temperature, max_tokens=200, max_turns=5)
    return eps, client.engine.stats


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_kept_cache_gives_the_same_episodes_and_prefills_less(temperature):
    kept, with_cache = episodes(True, temperature)
    again, without = episodes(False, temperature)
    assert kept == again  # tokens, masks, log-probs, finish reasons: bitwise
    assert sum(e.turns for e in kept) >= 6  # multi-turn episodes, several requests each
    assert with_cache.generated_tokens == without.generated_tokens
    saved = without.computed_tokens - with_cache.computed_tokens
    assert saved > 0 and with_cache.cached_tokens - without.cached_tokens == saved  # served instead of computed
    # what a kept sequence can save at most: every policy token but each turn's last (never computed in its turn)
    turns = sum(sum(1 for a, b in zip((0.0,) + e.policy_mask, e.policy_mask) if b == 1.0 and a == 0.0) for e in kept)
    assert saved <= sum(sum(e.policy_mask) for e in kept) + 16 * turns
