"""Ingest: every bad-input case named by file/row/column, de-duplication, the real-world formats, nothing half-written."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from align.data.ingest_parquet import RECORDS, SourceConfig, ingest_source
from align.data.schema import from_row
from align.exceptions import ConfigError, DataError
from align.config import from_dict
from align.utils.manifest import read_manifest

RAW = Path(__file__).resolve().parents[2] / "data" / "raw"


def _write(path: Path, rows: list[dict], schema: pa.Schema | None = None, row_group_size: int | None = None) -> Path:
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path, row_group_size=row_group_size)
    return path


def _records(out: Path) -> list[dict]:
    return pq.read_table(out / RECORDS).to_pylist()


def _gsm8k_rows(n: int) -> list[dict]:
    return [{"question": f"Tom has {i} apples and buys 2. How many?", "answer": f"{i}+2=<<{i}+2={i + 2}>>{i + 2}\n"
             f"#### {i + 2}"} for i in range(n)]


def test_bundled_sources_ingest_cleanly(tmp_path):
    src = SourceConfig(path=str(RAW / "math_sft.parquet"), kind="sft", format="messages", id_column="id",
                       group_column="level")
    manifest = ingest_source("math_sft", src, tmp_path / "out")
    assert manifest["rows_in"] == manifest["rows_out"] == 6000 and manifest["rejected"] == 0
    read_manifest(tmp_path / "out", kind="records", verify_hashes=True)
    first = from_row("sft", _records(tmp_path / "out")[0])
    assert first.id == "sft-00000" and first.group in {"1", "2", "3"}
    assert [m.role for m in first.messages] == ["user", "assistant"]


def test_gsm8k_format_to_sft_and_prompts(tmp_path):
    path = _write(tmp_path / "gsm8k.parquet", _gsm8k_rows(5) + [{"question": "Q?", "answer": "1,200 = 1200\n#### 1,200"}])
    ingest_source("g", SourceConfig(path=str(path), kind="sft", format="gsm8k"), tmp_path / "sft")
    rows = _records(tmp_path / "sft")
    assert rows[0]["messages"][1]["content"] == "0+2=2\nThe answer is \\boxed{2}."
    assert rows[0]["id"] == "g-0"
    ingest_source("g", SourceConfig(path=str(path), kind="prompts", format="gsm8k"), tmp_path / "p")
    assert [r["gold"] for r in _records(tmp_path / "p")] == ["2", "3", "4", "5", "6", "1200"]


def test_math_format_takes_the_last_balanced_boxed(tmp_path):
    rows = [{"problem": "Half of one?", "solution": "We get $\\boxed{\\frac{1}{2}}$.", "subject": "algebra"},
            {"problem": "Two?", "solution": "First \\boxed{1}, then \\boxed{2}", "subject": "x"}]
    path = _write(tmp_path / "math.parquet", rows)
    src = SourceConfig(path=str(path), kind="prompts", format="math", group_column="subject")
    ingest_source("m", src, tmp_path / "out")
    out = _records(tmp_path / "out")
    assert [(r["gold"], r["group"]) for r in out] == [("\\frac{1}{2}", "algebra"), ("2", "x")]


def test_argilla_pairs_split_the_shared_prompt(tmp_path):
    def conv(reply):
        return [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": reply}]

    rows = [{"chosen": conv("4"), "rejected": conv("5")},
            {"chosen": conv("4"), "rejected": [{"role": "user", "content": "3+3?"},
                                                {"role": "assistant", "content": "5"}]}]
    path = _write(tmp_path / "argilla.parquet", rows)
    with pytest.raises(DataError, match=r"1 of 2 rows rejected.*row 1, column 'rejected'"):
        ingest_source("a", SourceConfig(path=str(path), kind="pairs", format="argilla"), tmp_path / "out")
    ingest_source("a", SourceConfig(path=str(path), kind="pairs", format="argilla", max_reject_fraction=0.5),
                  tmp_path / "out")
    (row,) = _records(tmp_path / "out")
    assert row["prompt"] == [{"role": "user", "content": "2+2?"}] and (row["chosen"], row["rejected"]) == ("4", "5")


def test_column_renaming(tmp_path):
    path = _write(tmp_path / "x.parquet", [{"q": "What is 1+1?", "gold_answer": "2"}])
    src = from_dict(SourceConfig, {"path": str(path), "kind": "prompts", "format": "prompt_answer",
                                   "columns": {"prompt": "q", "answer": "gold_answer"}})
    ingest_source("x", src, tmp_path / "out")
    assert _records(tmp_path / "out")[0]["gold"] == "2"


def test_duplicates_are_dropped_and_counted(tmp_path):
    rows = _gsm8k_rows(3) + _gsm8k_rows(3) + _gsm8k_rows(1)
    path = _write(tmp_path / "d.parquet", rows, row_group_size=2)  # duplicates across row groups too
    manifest = ingest_source("d", SourceConfig(path=str(path), kind="prompts", format="gsm8k"), tmp_path / "out")
    assert (manifest["rows_in"], manifest["rows_out"], manifest["duplicates"]) == (7, 3, 4)
    assert [r["id"] for r in _records(tmp_path / "out")] == ["d-0", "d-1", "d-2"]


def test_streams_many_row_groups(tmp_path):
    path = _write(tmp_path / "big.parquet", _gsm8k_rows(500), row_group_size=37)
    assert pq.ParquetFile(path).num_row_groups > 10
    src = SourceConfig(path=str(path), kind="prompts", format="gsm8k", batch_rows=16)
    assert ingest_source("b", src, tmp_path / "out")["rows_out"] == 500
    assert [r["gold"] for r in _records(tmp_path / "out")] == [str(i + 2) for i in range(500)]


# ---------------------------------------------------------------------------------------------------- bad input

def _fails(tmp_path: Path, src: SourceConfig, match: str) -> None:
    out = tmp_path / "out"
    with pytest.raises(DataError, match=match):
        ingest_source("s", src, out)
    assert not out.exists()
    assert not list(tmp_path.glob("out.partial-*")), "a failed ingest left its staging directory"


def test_missing_file(tmp_path):
    _fails(tmp_path, SourceConfig(path=str(tmp_path / "nope.parquet"), kind="sft", format="gsm8k"),
           r"nope\.parquet: file not found")


def test_not_a_parquet_file(tmp_path):
    path = tmp_path / "notes.parquet"
    path.write_text("question,answer\n1,2\n")
    _fails(tmp_path, SourceConfig(path=str(path), kind="sft", format="gsm8k"),
           r"notes\.parquet: not a readable parquet file")


@pytest.mark.parametrize("keep", [0.5, 0.97])
def test_truncated_parquet(tmp_path, keep):
    good = _write(tmp_path / "good.parquet", _gsm8k_rows(2000), row_group_size=100)
    data = good.read_bytes()
    path = tmp_path / "cut.parquet"
    path.write_bytes(data[: int(len(data) * keep)])
    _fails(tmp_path, SourceConfig(path=str(path), kind="sft", format="gsm8k"), r"cut\.parquet: ")


def test_corrupt_row_group(tmp_path):
    good = _write(tmp_path / "good.parquet", _gsm8k_rows(2000), row_group_size=500)
    data = bytearray(good.read_bytes())
    meta = pq.ParquetFile(good).metadata.row_group(2).column(1)
    start = meta.data_page_offset
    data[start:start + 64] = b"\xff" * 64  # garbage where row group 2's answer pages begin
    path = tmp_path / "corrupt.parquet"
    path.write_bytes(bytes(data))
    _fails(tmp_path, SourceConfig(path=str(path), kind="sft", format="gsm8k"), r"corrupt\.parquet: row group 2")


def test_missing_column(tmp_path):
    path = _write(tmp_path / "m.parquet", [{"question": "q", "solution": "s"}])
    _fails(tmp_path, SourceConfig(path=str(path), kind="sft", format="gsm8k"),
           r"m\.parquet: missing column 'answer' .*columns present: question, solution")


def test_mistyped_column(tmp_path):
    path = _write(tmp_path / "t.parquet", [{"question": "q", "answer": 7}])
    _fails(tmp_path, SourceConfig(path=str(path), kind="sft", format="gsm8k"),
           r"t\.parquet: column 'answer' has type int64, expected string")


def test_mistyped_messages_column(tmp_path):
    path = _write(tmp_path / "t.parquet", [{"messages": ["user: hi"]}])
    _fails(tmp_path, SourceConfig(path=str(path), kind="sft", format="messages"),
           r"column 'messages' has type list<\w+: string>, expected list<struct<role: string")


def test_empty_dataset(tmp_path):
    path = _write(tmp_path / "e.parquet", [], schema=pa.schema([("question", pa.string()), ("answer", pa.string())]))
    _fails(tmp_path, SourceConfig(path=str(path), kind="sft", format="gsm8k"), r"e\.parquet: the dataset is empty")


def test_empty_answer_row_is_a_counted_rejection(tmp_path):
    rows = _gsm8k_rows(199) + [{"question": "What?", "answer": "#### "}]
    path = _write(tmp_path / "r.parquet", rows)
    src = SourceConfig(path=str(path), kind="prompts", format="gsm8k")
    manifest = ingest_source("r", src, tmp_path / "out")  # 1 of 200 = 0.5% <= 1%
    assert (manifest["rows_out"], manifest["rejected"]) == (199, 1)
    assert manifest["rejections"] == [{"row": 199, "column": "answer", "reason": "is empty after '####'"}]
    on_disk = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert on_disk["rejections"] == manifest["rejections"]


def test_rejections_over_the_ceiling_fail_naming_row_and_column(tmp_path):
    rows = _gsm8k_rows(10) + [{"question": "  ", "answer": "#### 3"}, {"question": "ok?", "answer": None}]
    path = _write(tmp_path / "r.parquet", rows)
    _fails(tmp_path, SourceConfig(path=str(path), kind="sft", format="gsm8k"),
           r"2 of 12 rows rejected, more than the allowed 1\.0%.*row 10, column 'question': is empty; "
           r"row 11, column 'answer': is null")


def test_bad_roles_are_rejected_with_their_position(tmp_path):
    rows = [{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
            {"messages": [{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}]},
            {"messages": [{"role": "user", "content": "a"}]}]
    path = _write(tmp_path / "roles.parquet", rows)
    with pytest.raises(DataError, match=r"row 1, column 'messages\[1\]\.role': 'bot' is not one of"):
        ingest_source("r", SourceConfig(path=str(path), kind="sft", format="messages"), tmp_path / "out")
    manifest = ingest_source("r", SourceConfig(path=str(path), kind="sft", format="messages",
                                               max_reject_fraction=1.0), tmp_path / "out")
    assert [r["reason"] for r in manifest["rejections"]][1] == "must end with a 'assistant' turn"


def test_a_failed_rerun_keeps_the_previous_output(tmp_path):
    path = _write(tmp_path / "g.parquet", _gsm8k_rows(5))
    ingest_source("g", SourceConfig(path=str(path), kind="prompts", format="gsm8k"), tmp_path / "out")
    before = (tmp_path / "out" / "manifest.json").read_text()
    path.write_text("garbage")
    with pytest.raises(DataError):
        ingest_source("g", SourceConfig(path=str(path), kind="prompts", format="gsm8k"), tmp_path / "out")
    assert (tmp_path / "out" / "manifest.json").read_text() == before


def test_config_rejects_format_kind_mismatch_and_unknown_columns():
    with pytest.raises(ConfigError, match="format 'argilla' makes pairs records, not 'sft'"):
        from_dict(SourceConfig, {"path": "x", "kind": "sft", "format": "argilla"})
    with pytest.raises(ConfigError, match="'questoin' is not a column of format 'gsm8k'"):
        from_dict(SourceConfig, {"path": "x", "kind": "sft", "format": "gsm8k", "columns": {"questoin": "q"}})
