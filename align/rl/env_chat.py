"""How an environment's observation enters the conversation: as a tool-result turn of the tokenizer's own chat
template where the template has one, else inline in the assistant's reply.

Tool turn (a Jinja template with a `tool` role: Qwen 2.5 / 3, Llama 3.x): the policy's turn ends at its end-of-turn
token (the tokenizer's EOS, sampled by the policy and trained like any of its tokens); the environment's tokens are
what the template renders between that token and the next assistant turn's first token, the generation prompt
included. They are found by rendering

    [user "q", assistant SENTINEL, tool OBSERVATION] + generation prompt

and taking the text after the first EOS that follows the sentinel: for Qwen 3

    "\\n<|im_start|>user\\n<tool_response>\\nOBSERVATION\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n"

tokenized with control tokens parsed, as align.tokenizer.chat_format.JinjaChat tokenizes a rendered SFT
conversation (so an observation that spells a control token becomes that token, as in `apply_chat_template`). The
text after the sentinel depends on the observation and the template only (one tool message after each assistant
turn, never two in a row), so what the policy reads in RL is what the template gives a tool turn in SFT data
(tests/rl/test_env_chat.py checks the episode's text against transformers' `apply_chat_template`).

Inline (Mistral v0.3's `[INST]` format has no tool role; a Jinja template that drops tool messages): the observation
text is appended to the assistant's reply as plain tokens, as before (`[environment] observation = "inline"`)."""

from __future__ import annotations

from typing import Literal

from align.exceptions import ConfigError, DataError
from align.tokenizer.chat_format import JinjaChat

SENTINEL = "ALIGN_ASSISTANT_TURN_SENTINEL"  # a plain word: no template rewrites it, no control token contains it
PROBE = "ALIGN_TOOL_OUTPUT_PROBE"

ObservationMode = Literal["auto", "tool_turn", "inline"]


class ToolTurns:
    """Observation text -> the token ids of its tool-result turn (module doc)."""

    def __init__(self, tok, chat: JinjaChat):
        if tok.eos_id is None:
            raise ConfigError(f"{chat.template.source}: the tokenizer has no eos_token, so an assistant turn has no "
                              f"end-of-turn token for the tool turn to follow")
        self.tok, self.chat = tok, chat
        self.eos_text = tok.id_to_token(tok.eos_id)

    def text(self, observation: str) -> str:
        messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": SENTINEL},
                    {"role": "tool", "content": observation}]
        full = self.chat.renderer.text(messages, True)
        at = full.find(SENTINEL)
        end = full.find(self.eos_text, at + len(SENTINEL)) if at >= 0 else -1
        if at < 0 or end < 0 or full.count(SENTINEL) != 1:
            raise DataError(f"{self.chat.template.source}: an assistant turn does not render as its content followed "
                            f"by {self.eos_text!r}, so the tool turn after it cannot be found")
        turn = full[end + len(self.eos_text):]
        if observation not in turn:
            raise DataError(f"{self.chat.template.source}: the chat template renders no tool turn (a tool message's "
                            f"content is not in its output)")
        return turn

    def __call__(self, observation: str) -> list[int]:
        return self.tok.encode(self.text(observation.strip()), parse_special=True)


def tool_turns_for(tok, mode: ObservationMode, where: str = "[environment] observation") -> ToolTurns | None:
    """The tool-turn encoder of `tok`'s chat format, or None for inline observations: "auto" takes the tool turn
    when the template renders one, "tool_turn" refuses a format without one, "inline" never takes it."""
    if mode == "inline":
        return None
    turns = ToolTurns(tok, tok.chat) if isinstance(tok.chat, JinjaChat) and tok.eos_id is not None else None
    why = f"the {tok.chat.name} chat format has no tool role"
    if turns is not None:
        try:
            turns.text(PROBE)
        except DataError as exc:
            turns, why = None, str(exc)
    if turns is None and mode == "tool_turn":
        raise ConfigError(f"{where} = \"tool_turn\": {why}; use \"inline\" (or \"auto\")")
    return turns
