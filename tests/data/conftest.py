"""Small real inputs for the data tests: records written by ingest, shard sets built with the vendored tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest

from align.data.shard_build import ShardBuildConfig, build_shards
from align.tokenizer import TokenizerConfig
from data_records import make_records


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
