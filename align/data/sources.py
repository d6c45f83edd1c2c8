"""Source formats: how the columns of a parquet file become schema records.

A source names a `format` (the layout of its columns) and the record `kind` to make of it. Each format has logical
columns with default names; a source config can rename them (`columns = { question = "problem_text" }`).

| format          | logical columns (type)                        | kinds          |
|-----------------|-----------------------------------------------|----------------|
| messages        | messages (list<struct<role, content>>), tools (optional) | sft            |
| prompt_response | prompt (string), response (string)            | sft            |
| gsm8k           | question (string), answer (string, `#### N`)  | sft, prompts   |
| math            | problem (string), solution (string, \\boxed)   | sft, prompts   |
| argilla         | chosen, rejected (list<struct<role, content>>) | pairs          |
| argilla_responses | instruction, chosen_response, rejected_response (string); optional chosen_rating, rejected_rating (number) | pairs |
| pair_columns    | prompt, chosen, rejected (string)             | pairs          |
| prompt_answer   | prompt (string), answer (string)              | prompts        |
| messages_answer | messages (ending with a user or tool turn), answer (string), tools (optional) | prompts |
| prm800k         | question, label (objects: PRM800K's JSONL)     | steps, pairs   |

`math` takes an optional `answer` column (MATH-500's layout): when present it is the gold, else the last `\boxed{}`
of the solution. `argilla_responses` is the layout of Argilla's exported preference datasets (one instruction, the
chosen and rejected responses and their ratings); a row whose chosen rating is not above its rejected rating is a
rejection, not a pair. `prm800k` rows (align.data.prm800k) become one step-labelled record, or several step-level
preference pairs.

A `messages` or `messages_answer` row may carry tools in the OpenAI / Hugging Face layout: `tool_calls` on
assistant turns (a list of `{"type": "function", "function": {"name", "arguments"}}`, or its JSON text; the turn's
content may be null or empty), `tool` turns with `tool_call_id` / `name` where present, and a `tools` column of
function definitions (JSON schema: a JSON text, or a list). Inside tool calls and definitions, keys whose value is
null are dropped: a parquet struct column fills every key any row has with null, which no template should render
(write JSON text to keep a null). Validation (align.data.schema) names the row and field, e.g.
`messages[2].tool_calls[0].function.name`.

GSM8K solutions become worked solutions in the bundled task's style: calculator annotations `<<48/2=24>>` are
dropped and the final `#### N` line becomes `The answer is \\boxed{N}.`, so every SFT source teaches one answer
format, the one the verifier reads."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import pyarrow as pa

from align.data.prm800k import prm800k_records
from align.data.schema import Conversation, Message, OutcomePrompt, PreferencePair, Record, RowError, validate

TEXT, MESSAGES, OBJECT, NUMBER, JSON = "text", "messages", "object", "number", "json"


@dataclass(frozen=True)
class Format:
    columns: dict[str, str]  # logical column -> TEXT | MESSAGES | OBJECT | NUMBER
    kinds: tuple[str, ...]
    optional: dict[str, str] = field(default_factory=dict)  # used when the file has them

    def all_columns(self) -> dict[str, str]:
        return {**self.columns, **self.optional}


FORMATS = {
    "messages": Format({"messages": MESSAGES}, ("sft",), {"tools": JSON}),
    "prompt_response": Format({"prompt": TEXT, "response": TEXT}, ("sft",)),
    "gsm8k": Format({"question": TEXT, "answer": TEXT}, ("sft", "prompts")),
    "math": Format({"problem": TEXT, "solution": TEXT}, ("sft", "prompts"), {"answer": TEXT}),
    "argilla": Format({"chosen": MESSAGES, "rejected": MESSAGES}, ("pairs",)),
    "argilla_responses": Format({"instruction": TEXT, "chosen_response": TEXT, "rejected_response": TEXT},
                                ("pairs",), {"chosen_rating": NUMBER, "rejected_rating": NUMBER}),
    "pair_columns": Format({"prompt": TEXT, "chosen": TEXT, "rejected": TEXT}, ("pairs",)),
    "prompt_answer": Format({"prompt": TEXT, "answer": TEXT}, ("prompts",)),
    "messages_answer": Format({"messages": MESSAGES, "answer": TEXT}, ("prompts",), {"tools": JSON}),
    "prm800k": Format({"question": OBJECT, "label": OBJECT}, ("steps", "pairs")),
}


# ---------------------------------------------------------------------------------------------------- arrow types

def type_ok(arrow_type: pa.DataType, expected: str) -> bool:
    """Whether a parquet column's type can carry a logical column of type TEXT or MESSAGES."""
    if expected == TEXT:
        return pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)
    if expected == OBJECT:
        return pa.types.is_struct(arrow_type)
    if expected == NUMBER:
        return pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type)
    if expected == JSON:  # JSON text, or the data itself as a list
        return type_ok(arrow_type, TEXT) or pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)
    if not (pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)):
        return False
    item = arrow_type.value_type
    if not pa.types.is_struct(item):
        return False
    names = {item.field(i).name: item.field(i).type for i in range(item.num_fields)}
    return all(k in names and type_ok(names[k], TEXT) for k in ("role", "content"))


def type_name(expected: str) -> str:
    return {TEXT: "string", OBJECT: "struct", NUMBER: "a number", JSON: "string (JSON) or list"}.get(expected,
                                                                      "list<struct<role: string, content: string>>")


# ---------------------------------------------------------------------------------------------------- answers

_CALC = re.compile(r"<<[^>]*>>")


def gsm8k_gold(answer: str) -> str:
    """The final answer after `####` (commas dropped: `1,200` -> `1200`)."""
    if "####" not in answer:
        raise RowError("answer", "has no '#### <final answer>' line")
    gold = answer.rsplit("####", 1)[1].strip().replace(",", "")
    if not gold:
        raise RowError("answer", "is empty after '####'")
    return gold


def gsm8k_solution(answer: str) -> str:
    gold = gsm8k_gold(answer)
    work = _CALC.sub("", answer.rsplit("####", 1)[0]).strip()
    return (work + "\n" if work else "") + f"The answer is \\boxed{{{gold}}}."


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (braces balanced), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j].strip()
    return None


def math_gold(solution: str, answer: str | None = None) -> str:
    if answer is not None and answer.strip():  # MATH-500 states the answer beside the solution
        return answer.strip()
    gold = last_boxed(solution)
    if not gold:
        raise RowError("solution", "has no complete non-empty \\boxed{...} answer")
    return gold


# ---------------------------------------------------------------------------------------------------- mapping

def _messages(field: str, raw: object, tools: bool = False) -> tuple[Message, ...]:
    if not isinstance(raw, list):
        raise RowError(field, f"expected a list of messages, got {type(raw).__name__}")
    out = []
    for i, m in enumerate(raw):
        calls = _json_field(f"{field}[{i}].tool_calls", m.get("tool_calls")) if tools and isinstance(m, dict) else None
        if not isinstance(m, dict) or m.get("role") is None or (m.get("content") is None and not calls):
            raise RowError(f"{field}[{i}]", "expected a message with non-null role and content")
        content = "" if m.get("content") is None else m["content"]  # an assistant turn that only calls tools
        if not isinstance(m["role"], str) or not isinstance(content, str):
            raise RowError(f"{field}[{i}]", "expected string role and content")
        if not tools:
            out.append(Message(m["role"], content))
            continue
        extras = {key: m.get(key) for key in ("tool_call_id", "name")}
        for key, value in extras.items():
            if value is not None and not isinstance(value, str):
                raise RowError(f"{field}[{i}].{key}", f"expected a string, got {type(value).__name__}")
        out.append(Message(m["role"], content, None if calls is None else tuple(calls), **extras))
    return tuple(out)


def _drop_nulls(value):
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def _json_field(field: str, value: object) -> list | None:
    """A list given as JSON text or as the list itself (nulls inside dropped), or None when absent."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise RowError(field, f"is not valid JSON ({exc})") from None
        if not isinstance(value, list):
            raise RowError(field, f"expected a JSON list, got {type(value).__name__}")
        return value
    if not isinstance(value, list):
        raise RowError(field, f"expected a list or its JSON text, got {type(value).__name__}")
    return _drop_nulls(value)


def _user(text: str) -> tuple[Message, ...]:
    return (Message("user", text),)


def _split_argilla(chosen: tuple[Message, ...], rejected: tuple[Message, ...]) -> tuple[tuple[Message, ...], str, str]:
    """Argilla-style pairs repeat the prompt in both lists; the prompt is everything before the last turn."""
    if len(chosen) < 2 or len(rejected) < 2:
        raise RowError("chosen", "expected a prompt and an assistant reply in both chosen and rejected")
    if chosen[:-1] != rejected[:-1]:
        raise RowError("rejected", "its prompt turns differ from chosen's")
    if chosen[-1].role != "assistant" or rejected[-1].role != "assistant":
        raise RowError("chosen", "the last turn of chosen and rejected must be an assistant reply")
    return chosen[:-1], chosen[-1].content, rejected[-1].content


def _check_types(fmt: str, row: dict) -> None:
    """Required columns non-null, every present value of its logical type (a JSONL row's values are untyped)."""
    for col, expected in FORMATS[fmt].all_columns().items():
        value = row.get(col)
        if value is None:
            if col in FORMATS[fmt].columns:
                raise RowError(col, "is null")
            continue
        if expected == TEXT and not isinstance(value, str):
            raise RowError(col, f"expected a string, got {type(value).__name__}")
        if expected == TEXT and not value.strip():
            raise RowError(col, "is empty")  # named here, as the file's column, not as a record field
        if expected == OBJECT and not isinstance(value, dict):
            raise RowError(col, f"expected an object, got {type(value).__name__}")
        if expected == NUMBER and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise RowError(col, f"expected a number, got {type(value).__name__}")
        if expected == JSON and not isinstance(value, (str, list)):
            raise RowError(col, f"expected a list or its JSON text, got {type(value).__name__}")


def _argilla_responses(row: dict, rid: str, group: str) -> PreferencePair:
    chosen, rejected = row.get("chosen_rating"), row.get("rejected_rating")
    if chosen is not None and rejected is not None and not chosen > rejected:
        raise RowError("chosen_rating", f"{chosen} is not above rejected_rating {rejected} (a tie or an "
                                        "inverted pair teaches no preference)")
    return PreferencePair(rid, _user(row["instruction"]), row["chosen_response"], row["rejected_response"], group)


def make_records(fmt: str, kind: str, row: dict, rid: str, group: str) -> list[Record]:
    """The records of one row (one, except PRM800K pairs: one per rated alternative), or `RowError`."""
    if fmt == "prm800k":
        _check_types(fmt, row)
        return prm800k_records(kind, row, rid, group)
    return [make_record(fmt, kind, row, rid, group)]


def make_record(fmt: str, kind: str, row: dict, rid: str, group: str) -> Record:
    """One record from one row (logical column names), or `RowError` naming the logical column."""
    _check_types(fmt, row)
    if fmt == "messages":
        tools = _json_field("tools", row.get("tools"))
        return Conversation(rid, _messages("messages", row["messages"], tools=True), group,
                            None if tools is None else tuple(tools))
    if fmt == "prompt_response":
        return Conversation(rid, (Message("user", row["prompt"]), Message("assistant", row["response"])), group)
    if fmt == "argilla":
        prompt, chosen, rejected = _split_argilla(_messages("chosen", row["chosen"]),
                                                  _messages("rejected", row["rejected"]))
        return PreferencePair(rid, prompt, chosen, rejected, group)
    if fmt == "argilla_responses":
        return _argilla_responses(row, rid, group)
    if fmt == "pair_columns":
        return PreferencePair(rid, _user(row["prompt"]), row["chosen"], row["rejected"], group)
    if fmt == "messages_answer":  # an RL prompt as a conversation so far (tool turns included) and its gold
        tools = _json_field("tools", row.get("tools"))
        record = OutcomePrompt(rid, _messages("messages", row["messages"], tools=True), row["answer"].strip(), group,
                               None if tools is None else tuple(tools))
        try:
            return validate(record)
        except RowError as exc:  # the record's `prompt` is this file's `messages` column: name that
            raise RowError("messages" + exc.field[len("prompt"):] if exc.field.startswith("prompt") else exc.field,
                           exc.reason) from None
    if fmt == "prompt_answer":
        return OutcomePrompt(rid, _user(row["prompt"]), row["answer"].strip(), group)
    question, worked, gold_of, solution_of = {
        "gsm8k": ("question", "answer", gsm8k_gold, gsm8k_solution),
        "math": ("problem", "solution", lambda s: math_gold(s, row.get("answer")), lambda s: s.strip()),
    }[fmt]
    if kind == "prompts":
        return OutcomePrompt(rid, _user(row[question]), gold_of(row[worked]), group)
    gold_of(row[worked])  # an SFT target without a final answer teaches nothing checkable: reject it
    return Conversation(rid, (Message("user", row[question]), Message("assistant", solution_of(row[worked]))), group)
