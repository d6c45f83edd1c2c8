"""Mistral v0.3 chat formatting: token ids and the loss mask, built together so no stage re-derives masks from text.

The layout is the Jinja template of Mistral-7B-Instruct-v0.3 (kept verbatim in
assets/tokenizer/mistral-7b-v0.3/chat_template.jinja, see the README there):

    <s>[INST] {user}[/INST] {assistant.strip()}</s>[INST] {user}[/INST]...

with an optional first `system` message written as "{system}\\n\\n" in front of the LAST user message (where
mistral-common puts it; an earlier hub revision of the template attached it only when that user message was the
final message, which silently drops the system prompt from every training conversation).

Ids are exactly what `tokenizers` gives for the rendered string (apply_chat_template), because every text piece
between two control tokens is encoded as its own segment, as tokenizers' added-token split does. One deliberate
difference: message text is encoded with `parse_special=False`, so a user who writes "[INST]" or "</s>" gets
those characters, never the control tokens (the rendered-string route would inject them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from align.exceptions import DataError

if TYPE_CHECKING:
    from align.tokenizer.tokenizer import Tokenizer

ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class ChatEncoding:
    ids: list[int]
    loss_mask: list[int]  # 1 on assistant content tokens and their closing </s>, 0 elsewhere


def encode_chat(tok: Tokenizer, messages: list[dict], add_generation_prompt: bool = False) -> ChatEncoding:
    """Ids and loss mask of a conversation. `add_generation_prompt` changes nothing in this template (a prompt
    already ends with [/INST]); asking for it after an assistant turn is an error."""
    system, turns = _validate(messages)
    if add_generation_prompt and turns[-1]["role"] != "user":
        raise DataError("chat: add_generation_prompt=True needs the conversation to end with a user message")
    inst, end_inst = _control_id(tok, "[INST]"), _control_id(tok, "[/INST]")
    if tok.bos_id is None or tok.eos_id is None:
        raise NotImplementedError(f"{tok.source}: the Mistral chat template needs bos and eos tokens")
    last_user = max(i for i, m in enumerate(turns) if m["role"] == "user")
    ids, mask = [tok.bos_id], [0]
    for i, message in enumerate(turns):
        content = message["content"]
        if message["role"] == "user":
            text = f"{system}\n\n{content}" if (system is not None and i == last_user) else content
            piece = [inst, *tok.encode(" " + text), end_inst]
            ids += piece
            mask += [0] * len(piece)
        else:
            piece = [*tok.encode(" " + content.strip()), tok.eos_id]
            ids += piece
            mask += [1] * len(piece)
    return ChatEncoding(ids, mask)


def encode_prompt(tok: Tokenizer, messages: list[dict]) -> list[int]:
    """The ids a model continues from: the conversation must end with a user message (ids end with [/INST])."""
    return encode_chat(tok, messages, add_generation_prompt=True).ids


def _validate(messages: list[dict]) -> tuple[str | None, list[dict]]:
    """(system text or None, the user/assistant turns), with the template's rules as clear errors."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise DataError("chat: messages must be a non-empty list of {'role', 'content'} dicts")
    for n, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise DataError(f"chat: message {n} must be a dict with 'role' and 'content', got {message!r:.80}")
        if message["role"] not in ROLES:
            raise DataError(f"chat: message {n} has role {message['role']!r}; supported: {', '.join(ROLES)} (the "
                            f"Mistral v0.3 format has no tool turns)")
        if not isinstance(message["content"], str):
            raise DataError(f"chat: message {n} content must be a string, got {type(message['content']).__name__}")
        tool_keys = sorted(k for k in ("tool_calls", "tool_call_id") if message.get(k) is not None)
        if tool_keys:  # the v0.3 template here has no tool turns: never drop a call silently
            raise DataError(f"chat: message {n} has {', '.join(tool_keys)}; the Mistral v0.3 format has no tool calls "
                            f"or tool results (use a tokenizer directory whose chat template renders tools)")
    system = messages[0]["content"] if messages[0]["role"] == "system" else None
    turns = list(messages[1:] if system is not None else messages)
    offset = len(messages) - len(turns)
    for k, message in enumerate(turns):
        expected = "user" if k % 2 == 0 else "assistant"
        if message["role"] != expected:
            raise DataError(f"chat: message {k + offset} has role {message['role']!r} where {expected!r} was expected "
                            f"(after an optional first system message, roles alternate user/assistant)")
    if not turns:
        raise DataError("chat: a conversation needs at least one user message")
    return system, turns


def _control_id(tok: Tokenizer, name: str) -> int:
    token_id = tok.token_to_id(name)
    if token_id is None or not tok.is_special(token_id):
        raise NotImplementedError(f"{tok.source}: the Mistral chat template needs the control token {name}")
    return token_id
