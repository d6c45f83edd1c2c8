"""The `ingest` and `shards` tasks under real doit on the smoke profile: built once, no-ops on the second run, rerun
when the raw parquet or the tokenizer file changes (and only what depends on it)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

from align.data.store import ShardSet

REPO = Path(__file__).resolve().parents[2]
DODO = """
from pathlib import Path
from pipeline.frame import install
from pipeline.layout import Project
from pipeline.stages.ingest import STAGE as INGEST
from pipeline.stages.shards import STAGE as SHARDS

install(globals(), project=Project(root=Path(__file__).resolve().parent), stages=[INGEST, SHARDS])
"""


def _project(tmp: Path) -> Path:
    for package in ("align", "pipeline"):
        (tmp / package).symlink_to(REPO / package)
    for rel in ("configs/smoke/common.toml", "configs/smoke/ingest.toml", "configs/smoke/shards.toml",
                "data/raw/math_sft.parquet", "data/raw/math_eval.parquet"):  # eval: the decontamination reference
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, tmp / rel)
    # a tokenizer directory of the project's own (relative to its root), so the test may change it
    shutil.copytree(REPO / "assets" / "tokenizer" / "mistral-7b-v0.3", tmp / "tok")
    shards = tmp / "configs" / "smoke" / "shards.toml"
    shards.write_text(shards.read_text().replace('path = "mistral-7b-v0.3"', 'path = "tok"'))
    ingest = tmp / "configs" / "smoke" / "ingest.toml"  # a smaller cut: the test is about reruns, not volume
    ingest.write_text(ingest.read_text().replace("max_rows = 768", "max_rows = 96").replace("batch_rows = 256",
                                                                                          "batch_rows = 32"))
    (tmp / "dodo.py").write_text(DODO)
    return tmp


def _doit(root: Path, *tasks: str) -> tuple[set[str], set[str]]:
    """Run doit; (tasks it ran, tasks it found up to date)."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", ALIGN_HEAVY_LOCK=str(root / "heavy.lock"))
    proc = subprocess.run([sys.executable, "-m", "doit", "-f", str(root / "dodo.py"), "profile=smoke", *tasks],
                          cwd=root, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ran = set(re.findall(r"^\.  (\S+)$", proc.stdout, re.M))
    skipped = set(re.findall(r"^-- (\S+)$", proc.stdout, re.M))
    return ran, skipped


def test_tasks_build_once_and_rerun_only_on_input_change(tmp_path):
    root = _project(tmp_path)
    assert _doit(root, "shards:sft")[0] == {"ingest:math_sft", "shards:sft"}
    runs = root / "runs" / "smoke"
    shards = ShardSet.open(runs / "shards" / "sft" / "out", kind="sft", verify_hashes=True)
    assert len(shards) == 96 and len(shards.manifest["shards"]) == 3  # the 2-process build ran
    receipt = json.loads((runs / "receipts" / "shards-sft.json").read_text())
    assert receipt["metrics"]["rows"] == 96 and "tok/tokenizer.json" in receipt["inputs"]

    assert _doit(root, "shards:sft") == (set(), {"ingest:math_sft", "shards:sft"})

    raw = root / "data" / "raw" / "math_sft.parquet"
    table = pq.read_table(raw)
    pq.write_table(table.slice(1), raw)  # the first row is gone: new content, same schema
    assert _doit(root, "shards:sft")[0] == {"ingest:math_sft", "shards:sft"}
    assert ShardSet.open(runs / "shards" / "sft" / "out").meta(0)["id"] == "sft-00001"

    tok = root / "tok" / "tokenizer.json"
    tok.write_text(json.dumps(json.loads(tok.read_text()), indent=1))  # same vocabulary, new file identity
    assert _doit(root, "shards:sft") == ({"shards:sft"}, {"ingest:math_sft"})
