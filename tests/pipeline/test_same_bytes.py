"""Same key, same bytes: the reference cache built twice from the same inputs, each time in a fresh worker process
with the launcher's worker environment (MKL_DYNAMIC / OMP_DYNAMIC pinned off), once on an idle CPU and once with
every core busy (busy-loop processes competing for them), is byte-identical, and its manifest records what the
numbers depend on. The smoke ladder's version of this check (every stage, idle and busy) is in docs/MEASUREMENTS.md."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.launcher import MALLOC_ENV, pinned_numerics_env

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "dpo"))
from stage_fixtures import build_pair_shards, pair_rows, save_tiny_checkpoint  # noqa: E402

CONFIG = """include = "common.toml"
reference = "sft_checkpoint/final"
[splits]
preference = "shards/preference/out"
[scoring]
batch_pairs = 8
chunk_size = 64
threads = 0
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("same_bytes")
    runs = tmp / "runs"
    save_tiny_checkpoint(runs / "sft_checkpoint" / "final", seed=0)
    build_pair_shards(tmp, runs / "shards" / "preference" / "out", pair_rows(24))
    (tmp / "common.toml").write_text("[run]\nseed = 3\n")
    (tmp / "ref_cache.toml").write_text(CONFIG)
    return runs


def build(runs: Path, name: str, busy: bool) -> Path:
    """One fresh worker process, as the launcher starts it; `busy`: every core runs a busy loop meanwhile."""
    run_dir = runs.parent / name
    env = dict(os.environ, **MALLOC_ENV, **pinned_numerics_env(), OMP_WAIT_POLICY="PASSIVE", PYTHONPATH=str(ROOT),
               ALIGN_RUNS_DIR=str(runs), ALIGN_RUN_DIR=str(run_dir), ALIGN_STAT_CACHE="off")
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)] \
        if busy else []
    try:
        res = subprocess.run([sys.executable, "-m", "align.stages.ref_cache", "--config",
                              str(runs.parent / "ref_cache.toml")], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=600)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert res.returncode == 0, res.stderr
    return run_dir / "preference"


@pytest.mark.slow  # it keeps every core busy for a minute
def test_reference_cache_is_byte_identical_idle_and_busy(runs):
    idle = build(runs, "idle", busy=False)
    busy = build(runs, "busy", busy=True)
    digest = [hashlib.sha256((d / "ref_logps.safetensors").read_bytes()).hexdigest() for d in (idle, busy)]
    assert digest[0] == digest[1]
    manifests = [json.loads((d / "manifest.json").read_text()) for d in (idle, busy)]
    assert manifests[0]["files"] == manifests[1]["files"]
    numerics = manifests[1]["numerics"]
    assert numerics["env"]["MKL_DYNAMIC"] == pinned_numerics_env()["MKL_DYNAMIC"]
    assert numerics["env"]["OMP_DYNAMIC"] == pinned_numerics_env()["OMP_DYNAMIC"]
    assert numerics["torch"]["threads"] == os.cpu_count()  # threads = 0: the host's CPUs, not the load
    assert numerics["torch"]["cpu_capability"] and numerics["cpu_count"] == os.cpu_count()
