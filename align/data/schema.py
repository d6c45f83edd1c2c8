"""Typed records for the four kinds of training data, their validation, and their normalised parquet layout.

- `Conversation` (kind "sft"): a chat with roles; the assistant turns are what SFT learns.
- `PreferencePair` (kind "pairs"): a prompt (messages ending with a user turn) and two assistant replies.
- `OutcomePrompt` (kind "prompts"): a prompt and the gold final answer a verifier checks a completion against.
- `StepLabelled` (kind "steps"): a prompt, a solution as its steps, a human rating per step (-1 wrong, 0 neutral,
  1 right; PRM800K's labels: what a process reward model learns) and the gold final answer.

Each record has an `id` (unique within its source) and a `group` (a free-form stratum such as a difficulty level,
"" when none; evaluation breaks accuracy down by it). Validation raises `RowError(field, reason)`; ingest turns it
into a counted rejection naming the file, the row and the column."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Union

import pyarrow as pa

from align.utils.fsio import sha256_bytes

ROLES = ("system", "user", "assistant")
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


@dataclass(frozen=True)
class Conversation:
    id: str
    messages: tuple[Message, ...]
    group: str = ""


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


def _check_messages(field: str, messages: tuple[Message, ...], last: str) -> None:
    """System turn optional and first; then user/assistant alternating from a user turn; ending with `last`."""
    if not messages:
        raise RowError(field, "has no messages")
    turns = list(messages)
    if turns[0].role == "system":
        _check_text(f"{field}[0].content", turns[0].content)
        turns = turns[1:]
    offset = len(messages) - len(turns)
    for i, msg in enumerate(turns):
        expected = ("user", "assistant")[i % 2]
        if msg.role not in ROLES:
            raise RowError(f"{field}[{i + offset}].role", f"{msg.role!r} is not one of {', '.join(ROLES)}")
        if msg.role != expected:
            raise RowError(f"{field}[{i + offset}].role", f"expected {expected!r} (turns alternate user/assistant "
                                                         f"after an optional system turn), got {msg.role!r}")
        _check_text(f"{field}[{i + offset}].content", msg.content)
    if not turns or turns[-1].role != last:
        raise RowError(field, f"must end with a {last!r} turn")


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
        _check_messages("messages", record.messages, last="assistant")
    elif isinstance(record, PreferencePair):
        _check_messages("prompt", record.prompt, last="user")
        _check_text("chosen", record.chosen)
        _check_text("rejected", record.rejected)
        if record.chosen == record.rejected:
            raise RowError("rejected", "is identical to chosen")
    elif isinstance(record, OutcomePrompt):
        _check_messages("prompt", record.prompt, last="user")
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
    return [{"role": m.role, "content": m.content} for m in messages]


def content_hash(record: Record) -> str:
    """sha256 of what a model would see (not the id or group): the de-duplication key."""
    if isinstance(record, Conversation):
        body = {"messages": messages_plain(record.messages)}
    elif isinstance(record, PreferencePair):
        body = {"prompt": messages_plain(record.prompt), "chosen": record.chosen, "rejected": record.rejected}
    elif isinstance(record, StepLabelled):
        body = {"prompt": messages_plain(record.prompt), "steps": list(record.steps), "ratings": list(record.ratings),
                "gold": record.gold}
    else:
        body = {"prompt": messages_plain(record.prompt), "gold": record.gold}
    return sha256_bytes(json.dumps([kind_of(record), body], sort_keys=True, ensure_ascii=False).encode())


# ---------------------------------------------------------------------------------------------------- parquet layout

MESSAGES_TYPE = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
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


def to_row(record: Record) -> dict:
    """The normalised parquet row of a record (schema `NORMALISED[kind]`)."""
    row = {"id": record.id, "group": record.group, "content_hash": content_hash(record)}
    if isinstance(record, Conversation):
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


def _messages(raw: list[dict]) -> tuple[Message, ...]:
    return tuple(Message(m["role"], m["content"]) for m in raw)


def from_row(kind: str, row: dict) -> Record:
    """Inverse of `to_row` (normalised rows are trusted: they were validated at ingest)."""
    if kind == "sft":
        return Conversation(row["id"], _messages(row["messages"]), row["group"])
    if kind == "pairs":
        return PreferencePair(row["id"], _messages(row["prompt"]), row["chosen"], row["rejected"], row["group"])
    if kind == "prompts":
        return OutcomePrompt(row["id"], _messages(row["prompt"]), row["gold"], row["group"])
    if kind == "steps":
        return StepLabelled(row["id"], _messages(row["prompt"]), tuple(row["steps"]), tuple(row["ratings"]),
                            row["gold"], row["group"])
    raise ValueError(f"unknown record kind {kind!r}; expected one of {', '.join(KINDS)}")
