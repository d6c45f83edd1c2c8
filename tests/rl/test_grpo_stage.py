"""The grpo_checkpoint worker on real artifacts (tokenizer, shards, checkpoint): publishes final/ and metrics.json
with the held-out accuracy before and after, logs every GRPO column, and a run stopped part-way then resumed ends
with the same weights as an uninterrupted one."""

from __future__ import annotations

import importlib
import json
import sys

from align.exit_codes import run_with_exit_codes
from align.model.checkpoint import checkpoint_content_hash
from align.utils.tracking import read_history
from stage_inputs import runs_tree


def run_worker(monkeypatch, runs, config, run_dir, *overrides) -> int:
    monkeypatch.setenv("ALIGN_RUNS_DIR", str(runs))
    monkeypatch.setenv("ALIGN_RUN_DIR", str(run_dir))
    monkeypatch.setattr(sys, "argv", ["align.stages.grpo", "--config", str(config), *overrides])
    return run_with_exit_codes(importlib.import_module("align.stages.grpo").main)


def test_stage_publishes_and_resumes_bit_exactly(tmp_path, monkeypatch):
    runs, config = runs_tree(tmp_path, steps=3)
    whole = runs / "whole"
    assert run_worker(monkeypatch, runs, config, whole) == 0
    metrics = json.loads((whole / "metrics.json").read_text())
    assert {"start_accuracy", "accuracy", "accuracy_gain", "reward_first", "reward_last", "reward_slope",
            "start_checkpoint"} <= set(metrics)
    assert metrics["heldout_rows"] == 4 and metrics["steps"] == 3
    assert not any(k.startswith("trained_") for k in metrics)  # [data] train_eval_rows = 0: no trained-prompt eval
    rows = read_history(whole / "history.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    for key in ("loss", "reward_mean", "entropy", "ratio_mean", "rho_abs_log_mean", "rollout/gen_s",
                "rollout/groups_kept", "canary/pass@1", "health/reward_baseline", "tokens_per_s"):
        assert key in rows[0], key
    assert rows[1]["canary/pass@1"] is not None and rows[0]["canary/pass@1"] is None  # every 2 steps
    assert (whole / "final" / "manifest.json").is_file()

    split = runs / "split"  # stopped after 1 step (mid-rollout: 2 windows per rollout), then resumed to 3
    # by a 0 s wall budget (exit 82, checkpoint at step 1): a smaller train.max_steps would be another run's
    # identity, and the second call would train from scratch instead of resuming
    assert run_worker(monkeypatch, runs, config, split, "train.max_wall_seconds=0") == 82
    assert [c.name for c in (split / "checkpoints").glob("step_*")] == ["step_1"]
    assert run_worker(monkeypatch, runs, config, split) == 0
    assert not (split / "checkpoints.superseded").exists()  # it did resume
    assert checkpoint_content_hash(split / "final") == checkpoint_content_hash(whole / "final")


def test_receipt_reports_the_trained_prompts_beside_the_heldout_split(tmp_path, monkeypatch):
    runs, config = runs_tree(tmp_path, steps=3)
    run_dir = runs / "trained"
    assert run_worker(monkeypatch, runs, config, run_dir, "data.train_eval_rows=6", "train.max_steps=2") == 0
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["trained_rows"] == 6 and metrics["heldout_rows"] == 4
    assert 0.0 <= metrics["trained_start_accuracy"] <= 1.0 and 0.0 <= metrics["trained_accuracy"] <= 1.0
    assert metrics["trained_accuracy_gain"] == metrics["trained_accuracy"] - metrics["trained_start_accuracy"]
    assert metrics["trained_accuracy_gain_se"] >= 0.0 and isinstance(metrics["trained_accuracy_by_level"], dict)
