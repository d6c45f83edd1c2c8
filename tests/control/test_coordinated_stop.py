"""Coordinated stop on the real SFT worker: a SIGTERM that reaches ONE of two ranks, mid-window, stops both ranks at
the same optimizer-step boundary with a complete checkpoint and exit 143, and the resumed run ends bitwise equal to
an uninterrupted one; a second SIGINT (and a third) landing inside the final save does not corrupt it: the
checkpoint holds the same state as the one an uninterrupted run writes at that step.

The random points are seeded (ALIGN_TEST_SEED changes the draw): one in the default tier, five more in `slow`."""

from __future__ import annotations

import os
import random

import pytest
import torch

from align.utils.manifest import read_manifest
from control_helpers import MAX_STEPS, Job, assert_bitwise_equal, fault_lines

SEED = os.environ.get("ALIGN_TEST_SEED", "0")


def sigterm_trial(job: Job, rng: random.Random, reference) -> None:
    step, micro, victim = rng.randint(1, MAX_STEPS), rng.randrange(2), rng.randrange(2)
    job.faults = f"signal:TERM@micro,step={step},micro={micro},rank={victim}"
    proc = job.run()
    what = f"{job.faults}\n{proc.stderr[-3000:]}"
    assert proc.returncode != 0, what  # torchrun reports a stopped worker as a failure
    assert [(r["rank"], r["code"], r["step"]) for r in job.last_exits()] == [(0, 143, step), (1, 143, step)], what
    assert [f[:3] for f in fault_lines(proc.stderr)][0][0] == victim  # only the victim was signalled
    assert max(job.complete_checkpoints()) == step and job.partial_dirs() == [], what
    assert [r["step"] for r in job.history()] == list(range(1, step + 1))  # nothing past the boundary
    assert not (job.run_dir / "HALT.json").exists()  # a signal is not a verdict: a supervisor may relaunch
    job.faults = ""
    proc = job.run()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r["resumed"] for r in job.last_exits()] == [f"step_{step}"] * 2
    assert_bitwise_equal(reference(2).final_weights(), job.final_weights())


@pytest.mark.distributed
def test_sigterm_to_one_of_two_ranks_stops_both_at_one_boundary(shards, reference, tmp_path):
    sigterm_trial(Job(tmp_path, shards, world=2), random.Random(f"{SEED}-sigterm-0"), reference)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("trial", range(1, 6))
def test_sigterm_at_more_random_points(shards, reference, tmp_path, trial):
    sigterm_trial(Job(tmp_path, shards, world=2), random.Random(f"{SEED}-sigterm-{trial}"), reference)


def test_second_sigint_during_the_final_save_does_not_corrupt_it(shards, reference, tmp_path):
    # Ctrl-C at step 4, then Ctrl-C again twice inside the save it triggers: once every file is staged, once the
    # manifest is written and the rename has not happened. Python's default handler would raise
    # KeyboardInterrupt there and the save would be rolled back (or, without staging, left half-written).
    job = Job(tmp_path, shards, world=1,
              faults="signal:INT@micro,step=4,micro=1;signal:INT@save:staged,step=4;signal:INT@save:manifest,step=4")
    proc = job.run()
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert [(f[2], f[3]) for f in fault_lines(proc.stderr)] == [
        ("signal:INT", "micro"), ("signal:INT", "save:staged"), ("signal:INT", "save:manifest")]
    assert job.complete_checkpoints() == [2, 4] and job.partial_dirs() == []
    # not merely complete: the same state as the step-4 checkpoint of an uninterrupted run (weights byte for
    # byte; optimizer, torch RNG, loader position, tripwire and skip state equal)
    mine, ref = job.run_dir / "checkpoints" / "step_4", reference(1).run_dir / "checkpoints" / "step_4"
    weights = "model/model.safetensors"
    assert read_manifest(mine, verify_hashes=True)["files"][weights] == read_manifest(ref)["files"][weights]
    assert_nested_equal(resume_state(mine), resume_state(ref))


def resume_state(ckpt) -> dict:
    """resume.pt without Python's and numpy's global RNG streams: the stage never seeds them (SFT draws nothing
    from them), so they differ between any two fresh processes; they are restored on resume all the same."""
    payload = torch.load(ckpt / "resume.pt", weights_only=True)
    for per_rank in payload["ranks"]:
        del per_rank["rng"]["python"], per_rank["rng"]["numpy"]
    return payload


def assert_nested_equal(a, b, path="resume.pt") -> None:
    assert type(a) is type(b), path
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            assert_nested_equal(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_nested_equal(x, y, f"{path}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), path
    else:
        assert a == b, path
