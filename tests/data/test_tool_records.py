"""Tool calls, tool results and tool definitions in `messages` sources: validation named by row and field, the
tool layout only where a record has tools (a tool-free source writes the bytes it wrote before), JSONL and
parquet-struct inputs, and the Mistral v0.3 format refusing tool turns (its ids unchanged otherwise)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from align.data.encoding import EncodingConfig, encode_record
from align.data.ingest_parquet import RECORDS, SourceConfig, ingest_source, iter_records
from align.data.schema import (Conversation, Message, NORMALISED, OutcomePrompt, PreferencePair, RowError,
                               content_hash, messages_plain, validate)
from align.exceptions import DataError
from align.tokenizer import Tokenizer

CALL = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}
TOOL = {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}


def _tool_chat() -> list[dict]:
    return [{"role": "user", "content": "1+2?"}, {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "c1", "name": "add", "content": "3"},
            {"role": "assistant", "content": "3"}]


def _plain(i: int) -> list[dict]:
    return [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_tool_free_source_keeps_its_layout_and_bytes(tmp_path):
    rows = [{"messages": _plain(i)} for i in range(5)]
    ingest_source("s", SourceConfig(kind="sft", format="messages", path=str(_jsonl(tmp_path / "a.jsonl", rows))),
                  tmp_path / "out")
    assert pq.read_schema(tmp_path / "out" / RECORDS) == NORMALISED["sft"]
    record = next(iter_records(tmp_path / "out" / RECORDS, "sft"))
    assert record.tools is None and messages_plain(record.messages) == _plain(0)  # no tool keys appear


def test_the_layout_switches_at_the_first_tool_record_and_keeps_earlier_rows(tmp_path):
    """Plain rows first (written in row groups of 2), a tool conversation last: the file is rewritten in the tool
    layout; every record reads back as it was, with the content hash of the plain-only ingest."""
    plain = [{"messages": _plain(i)} for i in range(5)]
    path = _jsonl(tmp_path / "mixed.jsonl", plain + [{"messages": _tool_chat(), "tools": json.dumps([TOOL])}])
    ingest_source("s", SourceConfig(kind="sft", format="messages", path=str(path), batch_rows=2), tmp_path / "out")
    ingest_source("s", SourceConfig(kind="sft", format="messages", path=str(_jsonl(tmp_path / "p.jsonl", plain)),
                                    batch_rows=2), tmp_path / "plain")
    mixed = list(iter_records(tmp_path / "out" / RECORDS, "sft"))
    alone = list(iter_records(tmp_path / "plain" / RECORDS, "sft"))
    assert mixed[:5] == alone and pq.ParquetFile(tmp_path / "out" / RECORDS).num_row_groups == 3
    assert [content_hash(r) for r in mixed[:5]] == [content_hash(r) for r in alone]
    tool = mixed[5]
    assert tool.tools == (TOOL,) and tool.messages[1].tool_calls == (CALL,) and tool.messages[1].content == ""
    assert (tool.messages[2].role, tool.messages[2].tool_call_id, tool.messages[2].name) == ("tool", "c1", "add")
    assert not list(tmp_path.glob("out/*.plain"))


def test_parquet_struct_tool_calls_drop_the_nulls_a_struct_adds(tmp_path):
    """A struct column holds every key any row has: `unit` is null where a call did not pass it."""
    calls = [{"id": "c1", "type": "function", "function": {"name": "w", "arguments": {"city": "Paris", "unit": None}}}]
    messages = [{"role": "user", "content": "w?", "tool_calls": None},
                {"role": "assistant", "content": "", "tool_calls": calls},
                {"role": "tool", "content": "22", "tool_calls": None}, {"role": "assistant", "content": "22",
                                                                        "tool_calls": None}]
    pq.write_table(pa.Table.from_pylist([{"messages": messages}]), tmp_path / "s.parquet")
    ingest_source("s", SourceConfig(kind="sft", format="messages", path=str(tmp_path / "s.parquet")), tmp_path / "o")
    record = next(iter_records(tmp_path / "o" / RECORDS, "sft"))
    assert record.messages[1].tool_calls[0]["function"]["arguments"] == {"city": "Paris"}


@pytest.mark.parametrize("messages, tools, column, reason", [
    ([{"role": "user", "content": "x"}, {"role": "tool", "content": "3"}, {"role": "assistant", "content": "y"}],
     None, "messages[1].role", "expected 'assistant'"),
    ([{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [CALL]},
      {"role": "user", "content": "y"}, {"role": "assistant", "content": "z"}], None, "messages[2].role",
     "expected 'tool'"),
    ([{"role": "user", "content": "x"},
      {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": " "}}]},
      {"role": "tool", "content": "3"}, {"role": "assistant", "content": "y"}], None,
     "messages[1].tool_calls[0].function.name", "non-empty string"),
    ([{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": "[{"},
      {"role": "tool", "content": "3"}, {"role": "assistant", "content": "y"}], None, "messages[1].tool_calls",
     "not valid JSON"),
    ([{"role": "user", "content": "x", "tool_call_id": "c1"}, {"role": "assistant", "content": "y"}], None,
     "messages[0].tool_call_id", "belongs to a tool turn"),
    ([{"role": "user", "content": "x"}, {"role": "assistant", "content": ""}], None, "messages[1].content",
     "is empty"),
    (_plain(0), "{not json", "tools", "not valid JSON"),
    (_plain(0), json.dumps([{"type": "function", "function": {"description": "no name"}}]), "tools[0]",
     "non-empty name"),
])
def test_bad_tool_rows_are_rejections_naming_row_and_field(tmp_path, messages, tools, column, reason):
    rows = [{"messages": _plain(i)} for i in range(9)] + [{"messages": messages, "tools": tools}]
    path = _jsonl(tmp_path / "bad.jsonl", rows)
    manifest = ingest_source("s", SourceConfig(kind="sft", format="messages", path=str(path),
                                               max_reject_fraction=0.5), tmp_path / "out")
    assert manifest["rejected"] == 1 and manifest["rows_out"] == 9
    rejection = manifest["rejections"][0]
    assert rejection["row"] == 9 and rejection["column"] == column and reason in rejection["reason"]


def test_tool_fields_are_for_conversations_and_rl_prompts_only():
    prompt = (Message("user", "x", tool_call_id="c1"),)
    with pytest.raises(RowError, match=r"prompt\[0\]: tool calls and results are carried by conversations and RL"):
        validate(PreferencePair("p", prompt, "a", "b"))
    with pytest.raises(RowError, match=r"prompt\[0\]\.tool_call_id: belongs to a tool turn"):
        validate(OutcomePrompt("p", prompt, "1"))


def test_the_mistral_format_refuses_tool_turns_and_keeps_its_ids():
    tok = Tokenizer.from_pretrained()  # the bundled Mistral v0.3 tokenizer
    plain = Conversation("a", (Message("user", "1+2?"), Message("assistant", "3")))
    before = tok.encode_chat(messages_plain(plain.messages))
    assert encode_record(tok, plain, EncodingConfig()).ids[0].tolist() == before.ids
    calls = Conversation("b", (Message("user", "1+2?"), Message("assistant", "", (CALL,)),
                               Message("tool", "3", tool_call_id="c1"), Message("assistant", "3")))
    with pytest.raises(DataError, match=r"chat: message 1 has tool_calls; the Mistral v0\.3 format has no tool calls"):
        encode_record(tok, calls, EncodingConfig())
    with pytest.raises(DataError, match=r"the Mistral v0\.3 format takes no tools"):
        encode_record(tok, Conversation("c", plain.messages, tools=(TOOL,)), EncodingConfig())
    with pytest.raises(DataError, match=r"message 1 has role 'tool'"):
        tok.encode_chat([{"role": "user", "content": "x"}, {"role": "tool", "content": "3"}])


def test_rl_prompts_carry_tools_and_may_end_with_tool_results(tmp_path):
    """`messages_answer` (kind prompts): the conversation so far and the gold; a plain prompt keeps the plain layout."""
    rows = [{"messages": _tool_chat()[:3], "answer": " 3 ", "tools": json.dumps([TOOL])},
            {"messages": [{"role": "user", "content": "2+2?"}], "answer": "4", "tools": None}]
    path = _jsonl(tmp_path / "rl.jsonl", rows)
    manifest = ingest_source("rl", SourceConfig(kind="prompts", format="messages_answer", path=str(path)),
                             tmp_path / "out")
    assert manifest["rows_out"] == 2 and manifest["rejected"] == 0
    tool, plain = iter_records(tmp_path / "out" / RECORDS, "prompts")
    assert tool.gold == "3" and tool.tools == (TOOL,) and tool.prompt[-1].role == "tool"
    assert plain.tools is None and plain.prompt == (Message("user", "2+2?"),)
    path = _jsonl(tmp_path / "plain.jsonl", rows[1:])
    ingest_source("rl", SourceConfig(kind="prompts", format="messages_answer", path=str(path)), tmp_path / "plain")
    assert pq.read_schema(tmp_path / "plain" / RECORDS) == NORMALISED["prompts"]
    bad = _jsonl(tmp_path / "bad.jsonl", [{"messages": _tool_chat(), "answer": "3"}] + rows[1:] * 9)
    manifest = ingest_source("rl", SourceConfig(kind="prompts", format="messages_answer", path=str(bad),
                                                max_reject_fraction=0.5), tmp_path / "bad")
    assert manifest["rejections"][0] == {"row": 0, "column": "messages",
                                         "reason": "must end with a 'user' or 'tool' turn"}
    tok = Tokenizer.from_pretrained()
    with pytest.raises(DataError, match=r"chat: the Mistral v0\.3 format takes no tools"):
        encode_record(tok, tool, EncodingConfig())
