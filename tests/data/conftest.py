"""Small real inputs for the data tests: records written by ingest, shard sets built with the vendored tokenizer."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from align.data.ingest_parquet import SourceConfig, ingest_source
from align.data.shard_build import ShardBuildConfig, build_shards
from align.tokenizer import TokenizerConfig


def _ingest(tmp: Path, name: str, rows: list[dict], src: dict, batch_rows: int) -> Path:
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
    return _ingest(tmp, kind, rows_of(n), src, batch_rows)


@pytest.fixture(autouse=True)
def _no_torchrun_env(monkeypatch):
    """A loader defaults to torchrun's RANK / WORLD_SIZE: keep a launcher's environment out of the tests."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session")
def records_factory():
    """`make_records(tmp, kind, n, batch_rows=16)`: a small ingest artifact of one kind."""
    return make_records


@pytest.fixture(scope="session")
def shard_sets(tmp_path_factory) -> dict[str, Path]:
    """One small shard set per kind: 61 sft rows (4 shards), 23 pairs, 17 prompts."""
    tmp = tmp_path_factory.mktemp("shards")
    out = {}
    for kind, n in (("sft", 61), ("pairs", 23), ("prompts", 17)):
        records = make_records(tmp, kind, n)
        build_shards(records, tmp / f"{kind}-shards", TokenizerConfig(), ShardBuildConfig(workers=1))
        out[kind] = tmp / f"{kind}-shards"
        out[f"{kind}-records"] = records
    return out
