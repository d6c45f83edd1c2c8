"""tests/rl: fixtures sit beside the tests; torch on one thread (two cores are shared).

The episode tests (test_env_cache.py, test_env_chat.py) share their setup here: a tiny random Mistral policy, a
rollout client decoding a copy of it, and a trivial environment that answers every turn with the same text."""

import copy
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(1)

from align.inference import EngineConfig  # noqa: E402  (after the thread setting above)
from align.model import MistralConfig, MistralForCausalLM  # noqa: E402
from align.rl.environment import EnvStep  # noqa: E402
from align.rollout import RolloutConfig, make_rollout_client  # noqa: E402


def _tiny_policy(vocab_size: int, eos_id: int, hidden_size: int, num_hidden_layers: int,
                 max_position_embeddings: int, seed: int = 0) -> MistralForCausalLM:
    """A seeded random Mistral policy: 4 query heads over 2 key-value heads, an MLP twice the hidden width."""
    torch.manual_seed(seed)
    return MistralForCausalLM(MistralConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_hidden_layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings, eos_token_id=eos_id))


def _episode_client(policy: torch.nn.Module, max_model_len: int, block_size: int):
    """A rollout client whose engine decodes its own copy of `policy` (the caller's model stays untouched)."""
    engine = EngineConfig(block_size=block_size, max_model_len=max_model_len)
    return make_rollout_client(RolloutConfig(engine=engine), copy.deepcopy(policy))


def _answering_env(observation: str) -> type:
    """An environment class (run_episode(s) take an instance or a factory) whose every turn the policy ends gets
    `observation`; reward 0 (these tests look at the episodes' tokens, not at rewards)."""

    class Answers:
        def reset(self, prompt, meta):
            pass

        def step(self, text):
            return EnvStep(observation)

        def reward(self, completion):
            return 0.0

    return Answers


@pytest.fixture(scope="session")
def tiny_policy():
    """tiny_policy(vocab_size, eos_id, hidden_size, num_hidden_layers, max_position_embeddings, seed=0)."""
    return _tiny_policy


@pytest.fixture(scope="session")
def episode_client():
    """episode_client(policy, max_model_len, block_size) -> a RolloutClient."""
    return _episode_client


@pytest.fixture(scope="session")
def answering_env():
    """answering_env(observation) -> an environment class."""
    return _answering_env
