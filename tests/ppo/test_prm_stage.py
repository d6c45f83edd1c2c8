"""The `prm_checkpoint` stage (align.stages.prm) on real artifacts: rule-labelled steps of the bundled task's right
and wrong solutions train a MistralForTokenClassification published in HF layout, with a held-out receipt; a
resumed run is bitwise the uninterrupted one (StepBatches' state); the pipeline task reads prm.toml's inputs."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

from align.data.ingest_parquet import SourceConfig, ingest_source
from align.data.mathtask import draw_problem, render_solution, wrong_solution

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "dpo"))
from stage_fixtures import run_worker, save_tiny_checkpoint  # noqa: E402

ROOT = TESTS.parent
FAST = ("train.max_steps=4", "train.checkpoint_every=2", "data.micro_batch_size=4", "data.threads=1",
        "data.heldout_every=5", "optimizer.lr=1e-2")


@pytest.fixture(scope="module")
def prm_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prm")
    rng, rows = random.Random(0), []
    while len(rows) < 20:
        problem = draw_problem(rng, rng.choice((2, 3)))
        wrong = wrong_solution(rng, problem, rng.choice(("slip", "final_copy")))
        if wrong is not None:
            rows.append({"prompt": problem.question, "chosen": render_solution(problem.steps), "rejected": wrong})
    pq.write_table(pa.Table.from_pylist(rows), tmp / "pairs.parquet")
    runs = tmp / "runs"
    ingest_source("pairs", SourceConfig(path=str(tmp / "pairs.parquet"), kind="pairs", format="pair_columns"),
                  runs / "onpolicy_pairs" / "out")
    save_tiny_checkpoint(runs / "sft_checkpoint" / "final", seed=0)
    config = tmp / "configs"
    config.mkdir()
    (config / "common.toml").write_text((ROOT / "configs/smoke/common.toml").read_text())
    (config / "prm.toml").write_text((ROOT / "configs/tiny/prm.toml").read_text())
    return runs, config / "prm.toml"


def test_stage_trains_and_publishes_a_token_classification_prm(prm_runs, tmp_path):
    runs, config = prm_runs
    run_dir = tmp_path / "prm"
    assert run_worker("align.stages.prm", config, runs, run_dir, *FAST) == 0
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["steps"] == 4 and metrics["skipped_solutions"] == 0
    assert metrics["train_solutions"] == 32 and metrics["heldout_steps"] > 0  # 4 of 20 pairs held out, 2 each
    assert 0 < metrics["heldout_positive_share"] < 1  # both kinds of step among the held-out ones
    for key in ("heldout_accuracy_before", "heldout_accuracy", "heldout_negative_accuracy", "heldout_loss"):
        assert 0 <= metrics[key] <= (1 if "accuracy" in key else 10), key
    hf = json.loads((run_dir / "final" / "config.json").read_text())
    assert hf["architectures"] == ["MistralForTokenClassification"]
    assert "score.bias" in load_file(str(run_dir / "final" / "model.safetensors"))


def test_resume_is_bitwise_equal_to_an_uninterrupted_run(prm_runs, tmp_path):
    runs, config = prm_runs
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert run_worker("align.stages.prm", config, runs, whole, *FAST) == 0
    assert run_worker("align.stages.prm", config, runs, parts, *FAST, "train.max_wall_seconds=0") == 82
    assert run_worker("align.stages.prm", config, runs, parts, *FAST) == 0
    assert not (parts / "checkpoints.superseded").exists()  # it did resume
    a = load_file(str(whole / "final" / "model.safetensors"))
    b = load_file(str(parts / "final" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_task_reads_its_inputs_from_prm_toml(tmp_path):
    from pipeline.layout import Layout, Project, StageCtx
    from pipeline.stages.prm import STAGE

    layout = Layout(Project(root=tmp_path), "p")
    layout.configs.mkdir(parents=True)
    (layout.configs / "prm.toml").write_text('[data]\ninit = "dpo_checkpoint/final"\n')
    deps = [p.relative_to(layout.runs).as_posix() for p in STAGE.file_dep(StageCtx(layout, STAGE.name))]
    assert deps == ["dpo_checkpoint/final/manifest.json", "onpolicy_pairs/out/manifest.json"]
    assert STAGE.extra and STAGE.optional
