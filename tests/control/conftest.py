"""tests/control: the control plane proven by fault injection on the real SFT stage worker (CPU, gloo).

Session fixtures: a tiny SFT shard set built by the data pipeline from the bundled math parquet, and uninterrupted
runs (one per world size) whose final weights every interrupted-and-resumed run must match bit for bit."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(1)

from control_helpers import ROOT, Job  # noqa: E402


@pytest.fixture(scope="session")
def shards(tmp_path_factory) -> Path:
    """ALIGN_RUNS_DIR holding shards/sft/out: the first 48 bundled math demonstrations, vendored tokenizer."""
    from align.data.ingest_parquet import SourceConfig, ingest_source
    from align.data.shard_build import ShardBuildConfig, build_shards
    from align.tokenizer import TokenizerConfig

    tmp = tmp_path_factory.mktemp("control_data")
    source = SourceConfig(path=str(ROOT / "data" / "raw" / "math_sft.parquet"), kind="sft", format="messages",
                          id_column="id", max_rows=48)
    ingest_source("math_sft", source, tmp / "records")
    build_shards(tmp / "records", tmp / "runs" / "shards" / "sft" / "out", TokenizerConfig(),
                 ShardBuildConfig(workers=1))
    return tmp / "runs"


@pytest.fixture(scope="session")
def reference(shards, tmp_path_factory):
    """reference(world) -> the Job of an uninterrupted run with that many ranks (run once, every checkpoint kept)."""
    cache: dict[int, Job] = {}

    def get(world: int) -> Job:
        if world not in cache:
            job = Job(tmp_path_factory.mktemp(f"reference_w{world}"), shards, world)
            proc = job.run()
            assert proc.returncode == 0, proc.stderr[-3000:]
            assert [r["code"] for r in job.last_exits()] == [0] * world
            cache[world] = job
        return cache[world]

    return get
