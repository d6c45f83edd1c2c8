"""The encoding pins a chat template's `date_string`: a Llama 3.2-style template (it writes "Today Date: ..." from
`date_string` when defined, else from `strftime_now`) encodes the same ids on any build day, and a change of the
pin changes the encoding's digest (the shard build's identity) and the ids."""

from __future__ import annotations

import shutil
from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import align.tokenizer.chat_template as chat_template
from align.config import config_digest
from align.data.encoding import DEFAULT_DATE_STRING, EncodingConfig, encode_record
from align.data.ingest_parquet import SourceConfig, ingest_source
from align.data.schema import Conversation, Message, OutcomePrompt
from align.data.shard_build import ShardBuildConfig, build_shards
from align.tokenizer import Tokenizer, TokenizerConfig

ASSET = Path(__file__).resolve().parents[2] / "assets" / "tokenizer" / "qwen3-tiny"
# the date logic of Llama 3.2's published template (lines 8-14, 33), around a plain ChatML body
LLAMA32_DATE = """{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{{- "<|im_start|>system\\nToday Date: " + date_string + "<|im_end|>\\n" }}
{%- for message in messages %}
{{- "<|im_start|>" + message.role + "\\n" }}{% generation %}{{ message.content + "<|im_end|>" }}{% endgeneration %}
{{- "\\n" }}
{%- endfor %}
{%- if add_generation_prompt %}{{- "<|im_start|>assistant\\n" }}{%- endif %}
"""

CHAT = Conversation("c", (Message("user", "What is 2+2?"), Message("assistant", "4")))
PROMPT = OutcomePrompt("p", (Message("user", "What is 2+2?"),), "4")


@pytest.fixture
def tok(tmp_path):
    directory = tmp_path / "tok"
    shutil.copytree(ASSET, directory)
    (directory / "chat_template.jinja").write_text(LLAMA32_DATE, encoding="utf-8")
    return Tokenizer.from_pretrained(str(directory))


def _on_day(monkeypatch, day: datetime) -> None:
    class Clock(datetime):
        @classmethod
        def now(cls, tz=None):
            return day

    monkeypatch.setattr(chat_template, "datetime", Clock)


def _ids(tok, record, cfg):
    return [a.tolist() for a in encode_record(tok, record, cfg).ids]


def test_two_build_days_give_the_same_ids_with_the_pin(tok, monkeypatch):
    cfg = EncodingConfig()
    days = [datetime(2026, 12, 7), datetime(2027, 3, 1)]
    pinned, unpinned = [], []
    for day in days:
        _on_day(monkeypatch, day)
        pinned.append((_ids(tok, CHAT, cfg), _ids(tok, PROMPT, cfg)))
        unpinned.append(tok.encode_prompt([{"role": "user", "content": "What is 2+2?"}]))  # the clock's date
    assert pinned[0] == pinned[1]
    assert unpinned[0] != unpinned[1]  # the clock does reach the template: without the pin the ids move
    text = tok.decode(pinned[0][1][0])
    assert f"Today Date: {DEFAULT_DATE_STRING}" in text


def test_a_changed_pin_changes_the_ids_and_the_digest(tok):
    other = EncodingConfig(date_string="01 Jan 2025")
    assert config_digest(other) != config_digest(EncodingConfig())
    assert _ids(tok, CHAT, other) != _ids(tok, CHAT, EncodingConfig())
    assert "Today Date: 01 Jan 2025" in tok.decode(_ids(tok, PROMPT, other)[0])


def test_the_mistral_format_takes_the_pin_and_its_ids_do_not_move():
    tok = Tokenizer.from_pretrained()  # Mistral v0.3: its template writes no date
    plain = tok.encode_chat([{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}])
    assert _ids(tok, CHAT, EncodingConfig(date_string="01 Jan 2025")) == [plain.ids]
    assert _ids(tok, PROMPT, EncodingConfig()) == [tok.encode_prompt([{"role": "user", "content": "What is 2+2?"}])]


def test_an_empty_pin_is_refused():
    with pytest.raises(ValueError, match="date_string must be a non-empty date"):
        EncodingConfig(date_string=" ")


def test_two_shard_builds_on_different_days_are_byte_identical(tok, tmp_path, monkeypatch):
    """build_shards through the Llama 3.2-style template on two "days": the same shard files; another pin, other
    ids and another encoding in the manifest (the build identity)."""
    rows = [{"prompt": f"What is {i} + 2?", "response": f"{i} + 2 = {i + 2}."} for i in range(6)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "sft.parquet")
    ingest_source("sft", SourceConfig(kind="sft", format="prompt_response", path=str(tmp_path / "sft.parquet")),
                  tmp_path / "records")
    tokenizer = TokenizerConfig(path=str(Path(tok.source).parent))
    builds = {}
    days = (("a", datetime(2026, 12, 7), EncodingConfig()), ("b", datetime(2027, 3, 1), EncodingConfig()),
            ("c", datetime(2027, 3, 1), EncodingConfig(date_string="01 Jan 2025")))
    for name, day, cfg in days:
        _on_day(monkeypatch, day)
        manifest = build_shards(tmp_path / "records", tmp_path / name, tokenizer,
                                ShardBuildConfig(encoding=cfg, workers=1))
        files = sorted(p for p in (tmp_path / name).iterdir() if p.name != "manifest.json")
        builds[name] = ([p.read_bytes() for p in files], manifest["encoding"])
    assert builds["a"] == builds["b"] and builds["a"][1]["date_string"] == DEFAULT_DATE_STRING
    assert builds["c"][0] != builds["a"][0] and builds["c"][1]["date_string"] == "01 Jan 2025"
