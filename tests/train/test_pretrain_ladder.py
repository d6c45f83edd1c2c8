"""The optional `pretrain_checkpoint` rung under real doit: an SFT whose `model.base` is the rung's `final/` makes
doit build the rung first; the rung's receipt carries the held-out perplexity before and after; a second run is a
no-op; a profile without pretrain.toml has no such task."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from align.data.synthetic_corpus import documents

REPO = Path(__file__).resolve().parents[2]
DODO = """
from pathlib import Path
from pipeline.frame import install
from pipeline.layout import Project
from pipeline.stages.ingest import STAGE as INGEST
from pipeline.stages.pretrain import STAGE as PRETRAIN
from pipeline.stages.sft import STAGE as SFT
from pipeline.stages.shards import STAGE as SHARDS

install(globals(), project=Project(root=Path(__file__).resolve().parent), stages=[INGEST, SHARDS, PRETRAIN, SFT])
"""
PRETRAIN_TOML = """include = "common.toml"
threads = 1

[train]
max_steps = 8
checkpoint_every = 4
keep_last = 1

[corpus]
heldout_every = 10

[corpus.sources.stories]
path = "data/corpus/stories.parquet"
weight = 3.0

[corpus.sources.facts]
path = "data/corpus/facts.parquet"

[model.init]
vocab_size = 32768
hidden_size = 32
intermediate_size = 64
num_hidden_layers = 1
num_attention_heads = 4
num_key_value_heads = 2
max_position_embeddings = 128
tie_word_embeddings = true
pad_token_id = 0

[loader]
seq_len = 64
micro_batch_size = 4

[heldout]
every = 4
max_windows = 4

[scheduler]
name = "wsd"
warmup_steps = 2
"""


def _project(tmp: Path) -> Path:
    for package in ("align", "pipeline"):
        (tmp / package).symlink_to(REPO / package)
    for rel in ("configs/smoke/common.toml", "configs/smoke/ingest.toml", "configs/smoke/shards.toml",
                "configs/smoke/sft.toml", "data/raw/math_sft.parquet",
                "data/raw/math_eval.parquet"):  # the eval set every ingest is checked against (align.data.decontam)
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, tmp / rel)
    ingest = tmp / "configs" / "smoke" / "ingest.toml"
    ingest.write_text(ingest.read_text().replace("max_rows = 768", "max_rows = 64").replace("batch_rows = 256",
                                                                                          "batch_rows = 32"))
    sft = tmp / "configs" / "smoke" / "sft.toml"
    sft.write_text(sft.read_text().replace("[model.init]", '[model]\nbase = "runs/smoke/pretrain_checkpoint/final"'
                                           '\n\n[model.init]').replace("max_steps = 16", "max_steps = 2"))
    (tmp / "configs" / "smoke" / "pretrain.toml").write_text(PRETRAIN_TOML)
    (tmp / "data" / "corpus").mkdir(parents=True)
    for source, n in (("stories", 200), ("facts", 100)):
        pq.write_table(pa.table({"text": documents(source, n)}), tmp / "data" / "corpus" / f"{source}.parquet")
    (tmp / "dodo.py").write_text(DODO)
    return tmp


def _doit(root: Path, *args: str) -> tuple[set[str], set[str], str]:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", ALIGN_HEAVY_LOCK=str(root / "heavy.lock"),
               OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "doit", "-f", str(root / "dodo.py"), *args], cwd=root,
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return (set(re.findall(r"^\.  (\S+)$", proc.stdout, re.M)), set(re.findall(r"^-- (\S+)$", proc.stdout, re.M)),
            proc.stdout)


def test_sft_from_the_rung_builds_it_first_and_reruns_nothing(tmp_path):
    root = _project(tmp_path)
    ran, _, out = _doit(root, "profile=smoke", "sft_checkpoint")
    assert ran == {"ingest:math_sft", "shards:sft", "pretrain_checkpoint", "sft_checkpoint"}
    assert out.index(".  pretrain_checkpoint") < out.index(".  sft_checkpoint")
    receipts = root / "runs" / "smoke" / "receipts"
    pre = json.loads((receipts / "pretrain_checkpoint.json").read_text())
    assert pre["metrics"]["heldout_ppl_after"] < pre["metrics"]["heldout_ppl_before"]
    assert {"data/corpus/stories.parquet", "data/corpus/facts.parquet"} <= set(pre["inputs"])
    sft = json.loads((receipts / "sft_checkpoint.json").read_text())
    assert "runs/smoke/pretrain_checkpoint/final/manifest.json" in sft["inputs"]
    assert _doit(root, "profile=smoke", "sft_checkpoint")[0] == set()

    (root / "configs" / "smoke" / "pretrain.toml").unlink()  # no config: the optional rung has no task
    listed = _doit(root, "profile=smoke", "list")[2]
    assert "pretrain_checkpoint" not in listed and "sft_checkpoint" in listed
