"""Small real inputs for the data tests: rows of each kind, and records written by ingest from them (a module, not
the conftest, so a test file imports it by one unambiguous name)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from align.data.ingest_parquet import SourceConfig, ingest_source


def ingest_rows(tmp: Path, name: str, rows: list[dict], src: dict, batch_rows: int) -> Path:
    path = tmp / f"{name}.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    ingest_source(name, SourceConfig(path=str(path), batch_rows=batch_rows, **src), tmp / f"{name}-records")
    return tmp / f"{name}-records"


def sft_rows(n: int) -> list[dict]:
    # lengths vary with i so token-budget batching has something to do
    return [{"prompt": f"Row {i}: what is {i} plus {i % 7}?" + " Think." * (i % 5),
             "response": f"{i} + {i % 7} = {i + i % 7}.\nThe answer is \\boxed{{{i + i % 7}}}."} for i in range(n)]


def pair_rows(n: int) -> list[dict]:
    return [{"prompt": f"What is {i} plus 2?", "chosen": f"{i} + 2 = {i + 2}.", "rejected": f"{i} + 2 = {i + 3}."}
            for i in range(n)]


def prompt_rows(n: int) -> list[dict]:
    return [{"prompt": f"What is {i} times 3?", "answer": str(3 * i)} for i in range(n)]


SOURCES = {
    "sft": (sft_rows, {"kind": "sft", "format": "prompt_response"}),
    "pairs": (pair_rows, {"kind": "pairs", "format": "pair_columns"}),
    "prompts": (prompt_rows, {"kind": "prompts", "format": "prompt_answer"}),
}


def make_records(tmp: Path, kind: str, n: int, batch_rows: int = 16) -> Path:
    rows_of, src = SOURCES[kind]
    return ingest_rows(tmp, kind, rows_of(n), src, batch_rows)
