"""align.rl.env_chat: an environment's observation as a tool-result turn of the chat template. On the bundled
qwen3-tiny tokenizer (Qwen 3's chat template) a real tiny policy runs multi-turn episodes through the engine; the
conversation it reads is exactly what transformers' `apply_chat_template` renders for the same messages (text and
ids), the tool turns carry no loss, and a format without a tool role keeps the inline observation or is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from align.exceptions import ConfigError
from align.model import MistralForCausalLM
from align.rl.env_chat import ToolTurns, tool_turns_for
from align.rl.environment import EnvStep, run_episode
from align.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[2]
QWEN3_TINY = ROOT / "assets" / "tokenizer" / "qwen3-tiny"
QUESTION = [{"role": "user", "content": "What is 17 * 23?"}]


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_pretrained(str(QWEN3_TINY))


TOOL_OUTPUT = "<result>391</result>\n"  # a real (trivial) environment: every turn the policy ends gets it


@pytest.fixture(scope="module")
def tool_env(answering_env):
    return answering_env(TOOL_OUTPUT)


@pytest.fixture(scope="module")
def chatty_policy(tok, tiny_policy) -> MistralForCausalLM:
    """A tiny random policy over the tokenizer's vocabulary that ends its turn often (EOS about a third of the time)
    and writes plain ASCII words otherwise: embedding dimension 0 is a large constant, so after the final norm it is
    about +sqrt(d) at every position, and the head's column 0 gives EOS +1 there and every token that is not plain
    printable ASCII -3 (never sampled in practice: their text would not survive a decode / re-render round trip)."""
    model = tiny_policy(tok.vocab_size, tok.eos_id, hidden_size=32, num_hidden_layers=1, max_position_embeddings=256)
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 4.0
        column = torch.full((tok.vocab_size,), -3.0)
        for i in range(tok.vocab_size):
            text = tok.decode([i])
            if not tok.is_special(i) and text and text.isascii() and text.isprintable() and "<" not in text:
                column[i] = 0.0
        column[tok.eos_id] = 1.0
        model.lm_head.weight[:, 0] = column
    return model


@pytest.fixture
def client(chatty_policy, episode_client):
    """A fresh engine on a copy of the chatty policy (nothing cached from another test)."""
    return episode_client(chatty_policy, max_model_len=256, block_size=4)


def run(tok, client, env, seed, max_turns=3, max_tokens=120):
    prompt = tok.encode_prompt(QUESTION)
    return prompt, run_episode(client, tuple(prompt), env, prompt="", meta={}, encode=tok.encode,
                               decode=lambda ids: tok.decode(ids, skip_special_tokens=True), eos_id=tok.eos_id,
                               newline_ids=(), temperature=1.0, max_tokens=max_tokens, max_turns=max_turns,
                               seed=seed, tool_turns=tool_turns_for(tok, "tool_turn"))


def segments(ep):
    """(start, end) of each run of equal policy_mask values, with the value."""
    out, start = [], 0
    mask = ep.policy_mask
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            out.append((start, i, mask[start]))
            start = i
    return out


def test_the_tool_turn_is_the_templates_text_between_two_assistant_turns(tok):
    turns = tool_turns_for(tok, "auto")
    assert isinstance(turns, ToolTurns)
    assert turns.text("391") == ("\n<|im_start|>user\n<tool_response>\n391\n</tool_response><|im_end|>\n"
                                 "<|im_start|>assistant\n")
    ids = turns("<result>391</result>\n")
    assert ids[0] == tok.token_to_id("Ċ") and tok.token_to_id("<|im_start|>") in ids  # controls parsed


def test_a_format_without_tool_turns_stays_inline_or_is_refused():
    mistral = Tokenizer.from_pretrained("mistral-7b-v0.3-tiny")
    assert tool_turns_for(mistral, "auto") is None and tool_turns_for(mistral, "inline") is None
    with pytest.raises(ConfigError, match="tool_turn.*no tool role"):
        tool_turns_for(mistral, "tool_turn")


@pytest.mark.oracle
def test_episodes_read_what_apply_chat_template_renders(tok, client, tool_env):
    """Every policy turn ends with EOS and is answered; the episode's prompt + completion through its last tool turn
    is, as text and as ids, transformers' rendering of [user, (assistant, tool) x turns] with the generation prompt;
    the tool turns (and only they) have policy_mask 0 and log-prob 0."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast.from_pretrained(str(QWEN3_TINY))
    checked = 0
    for seed in range(6):
        prompt, ep = run(tok, client, tool_env(), seed)
        runs = segments(ep)
        messages, ids = list(QUESTION), list(ep.completion_ids)
        for start, end, m in runs:
            if m == 1.0 and end < len(ids) and ids[end - 1] == tok.eos_id:
                messages.append({"role": "assistant", "content": tok.decode(ids[start:end - 1])})
            elif m == 0.0:
                assert ids[start - 1] == tok.eos_id  # a tool turn follows the policy's end-of-turn token
                assert all(lp == 0.0 for lp in ep.logprobs[start:end])
                messages.append({"role": "tool", "content": "<result>391</result>"})
                through = prompt + ids[:end]
                want = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
                assert tok.decode(through) == want
                want_ids = hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
                want_ids = want_ids["input_ids"] if hasattr(want_ids, "keys") else want_ids  # transformers 5: a dict
                assert list(ids[start:end]) == list(want_ids)[-(end - start):]  # the tool turn's ids, exactly
                checked += 1
        assert ep.turns == sum(1 for _, _, m in runs if m == 0.0) <= 3
    assert checked >= 4


def test_tool_turns_train_nothing_and_an_unanswered_turn_ends_the_episode(tok, client, tool_env):
    class Once(tool_env):
        def __init__(self):
            self.n = 0

        def step(self, text):
            self.n += 1
            return EnvStep("7" if self.n == 1 else "")

    prompt = tok.encode_prompt(QUESTION)
    for seed in range(4):
        ep = run_episode(client, tuple(prompt), Once(), prompt="", meta={}, encode=tok.encode,
                         decode=lambda ids: tok.decode(ids, skip_special_tokens=True), eos_id=tok.eos_id,
                         newline_ids=(), temperature=1.0, max_tokens=200, max_turns=4, seed=seed,
                         tool_turns=tool_turns_for(tok, "auto"))
        if ep.finish_reason != "stop":
            continue
        assert ep.turns == 1 and ep.completion_ids[-1] == tok.eos_id  # the second turn's EOS ends it
        masked = [t for t, m in zip(ep.completion_ids, ep.policy_mask) if m == 0.0]
        assert masked == tool_turns_for(tok, "auto")("7")
        return
    pytest.fail("no episode ended by its policy within the budget")


def test_the_stage_runner_takes_tool_turns_from_the_tokenizer(tok, client):
    """`episode_runner` on `[environment]` (what the GRPO and PPO stages call): "auto" on Qwen 3's template gives
    tool turns after EOS (no newline stops); "inline" gives plain observation tokens after a newline stop."""
    from align.rl.environment import EpisodeStart, episode_runner
    from align.rl.stage_config import EnvironmentConfig, RolloutShape

    shape = RolloutShape(max_new_tokens=80)
    prompt = tuple(tok.encode_prompt(QUESTION))
    starts = [EpisodeStart(prompt, "", {"gold": "391"}, seed=s) for s in range(4)]
    runner = episode_runner(EnvironmentConfig(max_turns=2), client, tok, shape)
    assert runner.keywords["tool_turns"] is not None
    inline = episode_runner(EnvironmentConfig(max_turns=2, observation="inline"), client, tok, shape)
    assert inline.keywords["tool_turns"] is None and inline.keywords["newline_ids"]
    for ep in runner(starts):  # the calculator answers nothing here: each episode is one turn, ended by EOS
        assert ep.turns == 0 and set(ep.policy_mask) <= {1.0}
        assert ep.finish_reason == "length" or ep.completion_ids[-1] == tok.eos_id
