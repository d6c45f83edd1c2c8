"""Incremental rebuilds of the real smoke ladder under real doit, in a private copy of the project: each kind of
edit reruns exactly the stages that depend on it.

  (a) the DPO beta in configs/smoke/dpo.toml  -> dpo_checkpoint, grpo_checkpoint and their evals (not ref_cache,
                                                 not SFT, not golden_eval:sft)
  (b) the GRPO loss code (align/rl/grpo_loss.py) -> grpo_checkpoint and golden_eval:grpo only
  (c) a parquet file's mtime, bytes unchanged  -> nothing (doit's md5 checker)
  (d) a parquet file's content (one SFT row)   -> every stage downstream of it: its ingest and shards, and every
                                                 checkpoint rung, cache and eval, the on-policy pairs and their
                                                 shards (the other sources' ingest/shards, whose bytes did not change,
                                                 stay)

A rerun must really redo the work: each rerun training stage trains from step 1 (not a resume of the previous run's
final checkpoint), and the DPO policy trained with the new beta differs from the old one.

Slow tier: a full smoke ladder plus three partial rebuilds (4-7 minutes on 2 shared cores at load 6-13, with
OMP_WAIT_POLICY=PASSIVE)."""

from __future__ import annotations

import os
import re

import pyarrow.parquet as pq
import pytest

from align.model.checkpoint import checkpoint_content_hash
from ladder_project import doit, make_project

pytestmark = pytest.mark.slow

RUNGS = ["sft_checkpoint", "ref_cache", "dpo_checkpoint", "grpo_checkpoint"]
EVALS = ["golden_eval:sft", "golden_eval:dpo", "golden_eval:grpo"]


def retrained(root, stage: str) -> bool:
    """Whether the stage's last launch trained from step 1 (a rerun must not resume the previous run's checkpoints:
    its inputs or code changed, so they are stale)."""
    log = (root / "runs/smoke" / stage / "worker.log").read_text()
    last = log[log.rindex("supervisor: attempt 1:"):]
    return re.search(r"step 1/\d+", last) is not None


def content_hash(root, stage: str) -> str:
    return checkpoint_content_hash(root / "runs/smoke" / stage / "final")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = make_project(tmp_path_factory.mktemp("ladder"))
    first = doit(root)
    assert first.returncode == 0, first.output[-4000:]
    assert set(RUNGS + EVALS) <= set(first.ran), first.ran
    again = doit(root)
    assert again.returncode == 0 and again.ran == [], again.output[-2000:]  # a no-op: nothing changed
    return root


def test_a_parquet_touch_reruns_nothing(built):
    path = built / "data/raw/math_sft.parquet"
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns + 10**10, st.st_mtime_ns + 10**10))
    res = doit(built)
    assert res.returncode == 0 and res.ran == [], res.output[-2000:]


def test_a_dpo_beta_edit_reruns_dpo_grpo_and_their_evals(built):
    before = content_hash(built, "dpo_checkpoint")
    cfg = built / "configs/smoke/dpo.toml"
    text = cfg.read_text()
    beta = re.search(r"^beta = (\S+)", text, re.M)
    cfg.write_text(text[: beta.start(1)] + repr(float(beta.group(1)) * 2) + text[beta.end(1):])
    res = doit(built)
    assert res.returncode == 0, res.output[-4000:]
    assert sorted(res.ran) == sorted(["dpo_checkpoint", "grpo_checkpoint", "golden_eval:dpo", "golden_eval:grpo",
                                      "report"])  # plain doit ends with the report, whose inputs changed
    assert retrained(built, "dpo_checkpoint") and retrained(built, "grpo_checkpoint")
    assert content_hash(built, "dpo_checkpoint") != before  # the new beta really trained a new policy


def test_a_grpo_loss_code_edit_reruns_grpo_and_its_eval(built):
    loss = built / "align/rl/grpo_loss.py"
    loss.write_text(loss.read_text() + "\n# an edit: the code digest of every stage that imports this file changes\n")
    res = doit(built)
    assert res.returncode == 0, res.output[-4000:]
    assert sorted(res.ran) == ["golden_eval:grpo", "grpo_checkpoint", "report"]
    assert retrained(built, "grpo_checkpoint")


def test_a_parquet_content_change_reruns_everything_downstream(built):
    path = built / "data/raw/math_sft.parquet"
    table = pq.read_table(path)
    rows = table.to_pylist()
    for row in rows:  # every row: the short smoke SFT must see the change, or its weights would not move
        row["messages"][0]["content"] = row["messages"][0]["content"].replace(".", " .", 1)
    pq.write_table(table.from_pylist(rows, schema=table.schema), path)
    chain = ("sft_checkpoint", "dpo_checkpoint", "grpo_checkpoint")
    before = {stage: content_hash(built, stage) for stage in chain}
    res = doit(built)
    assert res.returncode == 0, res.output[-4000:]
    # the new SFT policy samples new on-policy pairs (their manifest names the policy), so the preference shards
    # are rebuilt too
    assert sorted(res.ran) == sorted(["ingest:math_sft", "shards:sft", "onpolicy_pairs", "shards:preference", *RUNGS,
                                      *EVALS, "report"])
    assert retrained(built, "sft_checkpoint") and content_hash(built, "sft_checkpoint") != before["sft_checkpoint"]
    # A rung whose inputs' content changed trains afresh; one whose inputs are bytewise the same as last time
    # (possible further down) may resume its finished run: that is the run identity (align.train.identity).
    for upstream, stage in zip(chain, chain[1:]):
        assert retrained(built, stage) == (content_hash(built, upstream) != before[upstream]), stage
    assert content_hash(built, "dpo_checkpoint") != before["dpo_checkpoint"]
