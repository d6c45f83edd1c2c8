"""Typed records for the four kinds of training data, their validation, and their normalised parquet layout.

- `Conversation` (kind "sft"): a chat with roles; the assistant turns are what SFT learns.
- `PreferencePair` (kind "pairs"): a prompt (messages ending with a user turn) and two assistant replies.
- `OutcomePrompt` (kind "prompts"): a prompt and the gold final answer a verifier checks a completion against.
- `StepLabelled` (kind "steps"): a prompt, a solution as its steps, a human rating per step (-1 wrong, 0 neutral,
  1 right; PRM800K's labels: what a process reward model learns) and the gold final answer.

Each record has an `id` (unique within its source) and a `group` (a free-form stratum such as a difficulty level,
"" when none; evaluation breaks accuracy down by it). Validation raises `RowError(field, reason)`; ingest turns it
into a counted rejection naming the file, the row and the column.

Tools (a `Conversation` or an `OutcomePrompt`, the OpenAI / Hugging Face chat layout): an assistant turn may carry
`tool_calls` (each `{"type": "function", "function": {"name", "arguments"}}`, an optional `id`; its content may then
be empty),
answered by one or more `tool` turns (optional `tool_call_id`, `name`), after which the assistant speaks again
(an RL prompt may end with tool turns: the policy continues from the results);
`tools` are the function definitions (JSON schema) the chat template shows. A record without them is exactly the
record it was before tools existed: same content hash, same parquet layout (`NORMALISED`); a records file with
any tool field uses `NORMALISED_TOOLS` (tool calls and definitions as JSON text, their key order kept: templates
render them with `tojson`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Union

import pyarrow as pa

from align.utils.fsio import sha256_bytes

ROLES = ("system", "user", "assistant")
TOOL_ROLES = ROLES + ("tool",)
KINDS = ("sft", "pairs", "prompts", "steps")
STEP_RATINGS = (-1, 0, 1)


class RowError(ValueError):
    """One row violates its schema: `field` names the record field, the message says what was expected."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass(frozen=True)
class Message:
    role: str
    content: str
    tool_calls: tuple[dict, ...] | None = None  # assistant turns: the calls it makes
    tool_call_id: str | None = None  # tool turns: the call answered
    name: str | None = None  # tool turns: the function that answered

    @property
    def has_tool_fields(self) -> bool:
        return self.tool_calls is not None or self.tool_call_id is not None or self.name is not None


@dataclass(frozen=True)
class Conversation:
    id: str
    messages: tuple[Message, ...]
    group: str = ""
    tools: tuple[dict, ...] | None = None  # the function definitions the template shows (JSON schema)


@dataclass(frozen=True)
class PreferencePair:
    id: str
    prompt: tuple[Message, ...]
    chosen: str
    rejected: str
    group: str = ""


@dataclass(frozen=True)
class OutcomePrompt:
    id: str
    prompt: tuple[Message, ...]
    gold: str
    group: str = ""
    tools: tuple[dict, ...] | None = None  # the function definitions the template shows (JSON schema)


@dataclass(frozen=True)
class StepLabelled:
    id: str
    prompt: tuple[Message, ...]
    steps: tuple[str, ...]
    ratings: tuple[int, ...]  # one per step, in STEP_RATINGS
    gold: str
    group: str = ""


Record = Union[Conversation, PreferencePair, OutcomePrompt, StepLabelled]
RECORD_TYPES = {"sft": Conversation, "pairs": PreferencePair, "prompts": OutcomePrompt, "steps": StepLabelled}


# ---------------------------------------------------------------------------------------------------- validation

def _check_text(field: str, value: object) -> None:
    if not isinstance(value, str):
        raise RowError(field, f"expected a string, got {type(value).__name__}")
    if not value.strip():
        raise RowError(field, "is empty")


def _check_messages(field: str, messages: tuple[Message, ...], last: str | tuple[str, ...],
                    tools: bool = False) -> None:
    """System turn optional and first; then user/assistant alternating from a user turn; ending with `last`.
    With `tools` (conversations): an assistant turn with tool calls is followed by tool turns, then the assistant."""
    if not messages:
        raise RowError(field, "has no messages")
    turns = list(messages)
    if turns[0].role == "system":
        _check_text(f"{field}[0].content", turns[0].content)
        turns = turns[1:]
    offset = len(messages) - len(turns)
    expected = ("user",)
    for i, msg in enumerate(turns):
        where = f"{field}[{i + offset}]"
        roles = TOOL_ROLES if tools else ROLES
        if msg.role not in roles:
            raise RowError(f"{where}.role", f"{msg.role!r} is not one of {', '.join(roles)}")
        if msg.role not in expected:
            rule = ("turns alternate user/assistant after an optional system turn; tool turns follow an assistant "
                    "turn with tool_calls" if tools else "turns alternate user/assistant after an optional system "
                                                          "turn")
            raise RowError(f"{where}.role", f"expected {' or '.join(map(repr, expected))} ({rule}), got {msg.role!r}")
        _check_tool_fields(where, msg) if tools else _no_tool_fields(where, msg)
        if not (msg.role == "assistant" and msg.tool_calls):  # a turn that only calls tools may say nothing
            _check_text(f"{where}.content", msg.content)
        elif not isinstance(msg.content, str):
            raise RowError(f"{where}.content", f"expected a string, got {type(msg.content).__name__}")
        expected = {"user": ("assistant",), "tool": ("tool", "assistant")}.get(
            msg.role, ("tool",) if msg.tool_calls else ("user",))
    ends = (last,) if isinstance(last, str) else last
    if not turns or turns[-1].role not in ends:
        raise RowError(field, f"must end with a {' or '.join(map(repr, ends))} turn")


def _no_tool_fields(where: str, msg: Message) -> None:
    if msg.has_tool_fields:
        raise RowError(where, "tool calls and results are carried by conversations and RL prompts only")


def _check_json(where: str, value: object) -> None:
    """JSON data only (what a template can render with tojson)."""
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise RowError(where, f"expected string keys, got {type(k).__name__}")
            _check_json(f"{where}.{k}", v)
    elif isinstance(value, (list, tuple)):
        for j, v in enumerate(value):
            _check_json(f"{where}[{j}]", v)
    elif value is not None and type(value) not in (str, int, float, bool):
        raise RowError(where, f"expected JSON data, got {type(value).__name__}")


def _check_tool_fields(where: str, msg: Message) -> None:
    if msg.tool_calls is not None and msg.role != "assistant":
        raise RowError(f"{where}.tool_calls", f"only an assistant turn makes tool calls, not a {msg.role!r} turn")
    for key in ("tool_call_id", "name"):
        value = getattr(msg, key)
        if value is not None and msg.role != "tool":
            raise RowError(f"{where}.{key}", f"belongs to a tool turn, not a {msg.role!r} turn")
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise RowError(f"{where}.{key}", "expected a non-empty string")
    if msg.tool_calls is None:
        return
    if not isinstance(msg.tool_calls, tuple) or not msg.tool_calls:
        raise RowError(f"{where}.tool_calls", "expected a non-empty list of calls")
    for j, call in enumerate(msg.tool_calls):
        at = f"{where}.tool_calls[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            raise RowError(at, "expected {'type': 'function', 'function': {'name': ..., 'arguments': ...}}")
        if not isinstance(function.get("name"), str) or not function["name"].strip():
            raise RowError(f"{at}.function.name", "expected a non-empty string")
        if not isinstance(function.get("arguments"), (dict, str)):
            raise RowError(f"{at}.function.arguments", "expected an object or its JSON text, got "
                                                       f"{type(function.get('arguments')).__name__}")
        _check_json(at, call)


def _check_tools(tools: tuple[dict, ...] | None) -> None:
    if tools is None:
        return
    if not isinstance(tools, tuple) or not tools:
        raise RowError("tools", "expected a non-empty list of function definitions")
    for j, tool in enumerate(tools):
        function = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise RowError(f"tools[{j}]", "expected {'type': 'function', 'function': {'name': ..., 'parameters': "
                                          "...}} (a JSON schema with a non-empty name)")
        _check_json(f"tools[{j}]", tool)


def _check_steps(steps: tuple[str, ...], ratings: tuple[int, ...]) -> None:
    if not steps:
        raise RowError("steps", "has no steps")
    if len(ratings) != len(steps):
        raise RowError("ratings", f"has {len(ratings)} ratings for {len(steps)} steps")
    for i, (text, rating) in enumerate(zip(steps, ratings)):
        _check_text(f"steps[{i}]", text)
        if rating not in STEP_RATINGS or isinstance(rating, bool):
            raise RowError(f"ratings[{i}]", f"expected one of -1, 0, 1, got {rating!r}")


def validate(record: Record) -> Record:
    """Check one record against its kind's rules; return it unchanged or raise `RowError`."""
    _check_text("id", record.id)
    if isinstance(record, Conversation):
        _check_messages("messages", record.messages, last="assistant", tools=True)
        _check_tools(record.tools)
    elif isinstance(record, PreferencePair):
        _check_messages("prompt", record.prompt, last="user")
        _check_text("chosen", record.chosen)
        _check_text("rejected", record.rejected)
        if record.chosen == record.rejected:
            raise RowError("rejected", "is identical to chosen")
    elif isinstance(record, OutcomePrompt):
        with_tools = has_tools(record)  # then the prompt may end with tool results, the policy continuing from them
        _check_messages("prompt", record.prompt, last=("user", "tool") if with_tools else "user", tools=True)
        _check_tools(record.tools)
        _check_text("gold", record.gold)
    elif isinstance(record, StepLabelled):
        _check_messages("prompt", record.prompt, last="user")
        _check_text("gold", record.gold)
        _check_steps(record.steps, record.ratings)
    else:
        raise TypeError(f"not a record: {type(record).__name__}")
    return record


def kind_of(record: Record) -> str:
    return {Conversation: "sft", PreferencePair: "pairs", OutcomePrompt: "prompts", StepLabelled: "steps"}[type(record)]


# ---------------------------------------------------------------------------------------------------- identity

def messages_plain(messages: tuple[Message, ...]) -> list[dict]:
    """The chat-template messages: role and content, and the tool fields a message has (none: exactly as before)."""
    out = []
    for m in messages:
        plain = {"role": m.role, "content": m.content}
        if m.tool_calls is not None:
            plain["tool_calls"] = list(m.tool_calls)
        plain.update({k: v for k, v in (("tool_call_id", m.tool_call_id), ("name", m.name)) if v is not None})
        out.append(plain)
    return out


def tools_plain(record: Record) -> list[dict] | None:
    """The record's tool definitions as a template's `tools`, or None."""
    tools = getattr(record, "tools", None)
    return None if tools is None else list(tools)


def has_tools(record: Record) -> bool:
    """Whether the record needs the tool layout (`NORMALISED_TOOLS`)."""
    if isinstance(record, Conversation):
        return record.tools is not None or any(m.has_tool_fields for m in record.messages)
    if isinstance(record, OutcomePrompt):
        return record.tools is not None or any(m.has_tool_fields for m in record.prompt)
    return False


def content_hash(record: Record) -> str:
    """sha256 of what a model would see (not the id or group): the de-duplication key."""
    if isinstance(record, Conversation):
        body = {"messages": messages_plain(record.messages)}
        if record.tools is not None:
            body["tools"] = list(record.tools)
    elif isinstance(record, PreferencePair):
        body = {"prompt": messages_plain(record.prompt), "chosen": record.chosen, "rejected": record.rejected}
    elif isinstance(record, StepLabelled):
        body = {"prompt": messages_plain(record.prompt), "steps": list(record.steps), "ratings": list(record.ratings),
                "gold": record.gold}
    else:
        body = {"prompt": messages_plain(record.prompt), "gold": record.gold}
        if record.tools is not None:
            body["tools"] = list(record.tools)
    return sha256_bytes(json.dumps([kind_of(record), body], sort_keys=True, ensure_ascii=False).encode())


# ---------------------------------------------------------------------------------------------------- parquet layout

MESSAGES_TYPE = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
# tool calls and definitions as JSON text (any JSON: a parquet struct would fill absent keys with null)
TOOL_MESSAGES_TYPE = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string()), ("tool_calls", pa.string()),
                                         ("tool_call_id", pa.string()), ("name", pa.string())]))
NORMALISED = {
    "sft": pa.schema([("id", pa.string()), ("group", pa.string()), ("messages", MESSAGES_TYPE),
                      ("content_hash", pa.string())]),
    "pairs": pa.schema([("id", pa.string()), ("group", pa.string()), ("prompt", MESSAGES_TYPE),
                        ("chosen", pa.string()), ("rejected", pa.string()), ("content_hash", pa.string())]),
    "prompts": pa.schema([("id", pa.string()), ("group", pa.string()), ("prompt", MESSAGES_TYPE),
                          ("gold", pa.string()), ("content_hash", pa.string())]),
    "steps": pa.schema([("id", pa.string()), ("group", pa.string()), ("prompt", MESSAGES_TYPE),
                        ("steps", pa.list_(pa.string())), ("ratings", pa.list_(pa.int8())), ("gold", pa.string()),
                        ("content_hash", pa.string())]),
}
# a records file holding any tool field (conversations and RL prompts)
NORMALISED_TOOLS = {
    "sft": pa.schema([("id", pa.string()), ("group", pa.string()), ("messages", TOOL_MESSAGES_TYPE),
                      ("tools", pa.string()), ("content_hash", pa.string())]),
    "prompts": pa.schema([("id", pa.string()), ("group", pa.string()), ("prompt", TOOL_MESSAGES_TYPE),
                          ("tools", pa.string()), ("gold", pa.string()), ("content_hash", pa.string())]),
}


def layout(kind: str, tools: bool) -> pa.Schema:
    return NORMALISED_TOOLS[kind] if tools else NORMALISED[kind]


def _json(value) -> str | None:
    return None if value is None else json.dumps(list(value), ensure_ascii=False)


def _tool_rows(messages: tuple[Message, ...]) -> list[dict]:
    return [{"role": m.role, "content": m.content, "tool_calls": _json(m.tool_calls), "tool_call_id": m.tool_call_id,
             "name": m.name} for m in messages]


def to_row(record: Record, tools: bool = False) -> dict:
    """The normalised parquet row of a record (schema `layout(kind, tools)`)."""
    row = {"id": record.id, "group": record.group, "content_hash": content_hash(record)}
    if isinstance(record, Conversation) and tools:
        row.update(messages=_tool_rows(record.messages), tools=_json(record.tools))
    elif isinstance(record, OutcomePrompt) and tools:
        row.update(prompt=_tool_rows(record.prompt), tools=_json(record.tools), gold=record.gold)
    elif isinstance(record, Conversation):
        row["messages"] = messages_plain(record.messages)
    else:
        row["prompt"] = messages_plain(record.prompt)
        if isinstance(record, PreferencePair):
            row.update(chosen=record.chosen, rejected=record.rejected)
        elif isinstance(record, StepLabelled):
            row.update(steps=list(record.steps), ratings=list(record.ratings), gold=record.gold)
        else:
            row["gold"] = record.gold
    return row


def _from_json(text: str | None) -> tuple | None:
    return None if text is None else tuple(json.loads(text))


def _messages(raw: list[dict]) -> tuple[Message, ...]:
    return tuple(Message(m["role"], m["content"], _from_json(m.get("tool_calls")), m.get("tool_call_id"),
                         m.get("name")) for m in raw)


def from_row(kind: str, row: dict) -> Record:
    """Inverse of `to_row` (normalised rows are trusted: they were validated at ingest)."""
    if kind == "sft":
        return Conversation(row["id"], _messages(row["messages"]), row["group"], _from_json(row.get("tools")))
    if kind == "pairs":
        return PreferencePair(row["id"], _messages(row["prompt"]), row["chosen"], row["rejected"], row["group"])
    if kind == "prompts":
        return OutcomePrompt(row["id"], _messages(row["prompt"]), row["gold"], row["group"],
                             _from_json(row.get("tools")))
    if kind == "steps":
        return StepLabelled(row["id"], _messages(row["prompt"]), tuple(row["steps"]), tuple(row["ratings"]),
                            row["gold"], row["group"])
    raise ValueError(f"unknown record kind {kind!r}; expected one of {', '.join(KINDS)}")
