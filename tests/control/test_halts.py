"""Verdicts under the supervisor, neither relaunched: a NaN on ONE of two gloo ranks (torchrun reports 1 for any failed
worker, so HALT.json carries the verdict) makes both ranks skip and then halt 81 together, no hang; a spent wall
budget checkpoints and stops 82. Each run is bounded by TIMEOUT_S (300 s), far below the 1800 s collective timeout a
one-sided halt would otherwise wait out."""

from __future__ import annotations

import json

import pytest

from control_helpers import Job, fault_lines


def halt_marker(job: Job) -> dict:
    return json.loads((job.run_dir / "HALT.json").read_text())


@pytest.mark.distributed
def test_nan_on_one_rank_skips_on_both_then_halts_81(shards, tmp_path):
    job = Job(tmp_path, shards, world=2, faults="nan@micro,step=4+,rank=1")  # rank 1's forward is NaN from step 4
    code = job.supervised()
    what = job.log_tail()
    assert code == 81 and job.attempts() == 1, what  # the verdict from HALT.json, not torchrun's 1; no relaunch
    assert "supervisor: stop: HALT.json written during the attempt (exit 81" in job.log.read_text(), what
    assert {f[0] for f in fault_lines(job.log.read_text())} == {1}  # the fault fired on rank 1 only
    # steps 4-7 skipped on both ranks (no update, schedule frozen): 4 > max_consecutive_skipped_steps = 3
    assert [(r["rank"], r["code"], r["step"]) for r in job.last_exits()] == [(0, 81, 7), (1, 81, 7)], what
    rows = job.history()
    assert [r["applied"] for r in rows] == [1.0] * 3 + [0.0] * 4
    assert [r["lr"] for r in rows[3:]] == [rows[3]["lr"]] * 4  # the schedule did not advance
    assert rows[-1]["skipped_total"] == 4.0
    marker = halt_marker(job)
    assert marker["exit_code"] == 81 and "4 consecutive skipped steps" in marker["reason"]
    assert job.complete_checkpoints() == [2, 4, 6]  # a halt is a verdict, not a stop: nothing new is saved


def test_wall_budget_checkpoints_and_stops_82_without_relaunch(shards, tmp_path):
    # One process: the one-rank-slow case is tests/train/test_distributed.py's; here the verdict meets the supervisor.
    job = Job(tmp_path, shards, world=1, faults="delay:4@micro,step=3",
              overrides=("train.max_wall_seconds=3", "train.checkpoint_every=0"))
    code = job.supervised()
    what = job.log_tail()
    assert code == 82 and job.attempts() == 1, what
    assert "supervisor: stop: exit 82 (wall budget spent) is a verdict, not relaunched" in job.log.read_text(), what
    [(exit_code, step)] = [(r["code"], r["step"]) for r in job.last_exits()]
    assert exit_code == 82 and step <= 3, what  # a loaded host may spend the budget sooner
    assert job.complete_checkpoints() == [step]  # the stop wrote its checkpoint
    assert len(job.history()) == step
    marker = halt_marker(job)
    assert marker["exit_code"] == 82 and "max_wall_seconds = 3.0" in marker["reason"]
    assert not (job.run_dir / "final").exists()  # a stopped run publishes nothing
