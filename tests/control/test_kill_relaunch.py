"""SIGKILL of the SFT worker at random moments, including inside a checkpoint save, under the launch supervisor:
the supervisor relaunches, the relaunch resumes from the newest COMPLETE checkpoint (never a partial one), nothing
half-written survives, and the final weights equal an uninterrupted run's bit for bit.

Kinds of trial (a seeded random step / rank / moment each; ALIGN_TEST_SEED changes the draw):
    external        the test SIGKILLs a rank at a random moment once a checkpoint is complete and >= n steps ran
    external-save   a 1.5 s delay is injected inside a save (save:staged) and the test SIGKILLs the rank there
    self:<point>    the worker SIGKILLs itself at an exact point: micro (mid-window), save:begin, save:staged,
                    save:manifest (manifest written, not renamed), save:published (renamed, before the last barrier)
Default tier: 3 trials, one process. Long tier (`slow`): 10 trials, 2 gloo ranks under torchrun."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest

from control_helpers import EVERY, MAX_STEPS, Job, assert_bitwise_equal, fault_lines

SEED = os.environ.get("ALIGN_TEST_SEED", "0")
SELF_POINTS = ("micro", "save:begin", "save:staged", "save:manifest", "save:published")
IN_SAVE = ("external-save", "self:save:begin", "self:save:staged", "self:save:manifest")  # before the rename


def plan(kind: str, rng: random.Random, world: int) -> dict:
    """The trial's fault spec and where the kill lands; `expect` is the checkpoint the relaunch must resume from."""
    victim = rng.randrange(world)
    if kind == "external":
        return {"faults": "", "victim": victim, "rows": rng.randint(3, MAX_STEPS - 2), "pause": rng.uniform(0, 0.3)}
    if kind == "external-save":
        step = rng.choice([4, 6])
        return {"faults": f"delay:1.5@save:staged,step={step},rank={victim},once", "victim": victim,
                "expect": step - EVERY}
    point = kind.removeprefix("self:")
    if point == "micro":
        step, micro = rng.randint(3, MAX_STEPS - 1), rng.randrange(2)
        return {"faults": f"kill@micro,step={step},micro={micro},rank={victim},once", "victim": victim,
                "expect": (step - 1) // EVERY * EVERY}
    if point in ("save:manifest", "save:published"):
        victim = 0  # these points exist on the rank that writes the manifest and renames
    step = rng.choice([2, 4, 6] if point == "save:published" else [4, 6])
    return {"faults": f"kill@{point},step={step},rank={victim},once", "victim": victim,
            "expect": step if point == "save:published" else step - EVERY}


def _dead(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"  # a zombie awaiting its parent's wait() holds nothing


def _kill_externally(job: Job, spec: dict) -> None:
    if "rows" in spec:  # a random moment after a complete checkpoint and >= rows steps
        job.wait_for(lambda: len(job.history()) >= spec["rows"] and job.complete_checkpoints(), "progress")
        time.sleep(spec["pause"])
    else:  # inside the save: the injected delay announced itself in the log
        job.wait_for(lambda: [f for f in fault_lines(job.log.read_text() if job.log.is_file() else "")
                              if f[0] == spec["victim"]], "the in-save delay")
    os.kill(job.pid(spec["victim"]), signal.SIGKILL)


def kill_trial(job: Job, kind: str, rng: random.Random, reference) -> None:
    spec = plan(kind, rng, job.world)
    job.faults = spec["faults"]
    sup = job.supervise(retries=2)
    try:
        job.wait_for(lambda: all((job.dir / f"pid_rank{r}").is_file() for r in range(job.world)), "the workers")
        job.wait_for(lambda: job.history(), "the first step")  # the pid files are the first attempt's
        first = [job.pid(r) for r in range(job.world)]
        if kind.startswith("external"):
            _kill_externally(job, spec)
        job.wait_for(lambda: all(_dead(p) for p in first), "attempt 1's workers to die")
        # NOTE: the relaunch needs seconds (imports, at least one step) before it could publish anything
        newest, partials = max(job.complete_checkpoints()), job.partial_dirs()
        code = sup.wait(timeout=300)
    finally:
        if sup.poll() is None:
            sup.kill()
    what = f"{kind} {spec}: log tail\n{job.log_tail()}"
    assert code == 0 and job.attempts() == 2, what
    if "expect" in spec:
        assert newest == spec["expect"], what
    if kind in IN_SAVE:
        landed = [f for f in fault_lines(job.log.read_text()) if f[0] == spec["victim"] and f[3].startswith("save:")]
        assert landed, f"the kill did not land inside the save: {what}"
        if spec["victim"] == 0:  # the staging dir's owner died: nobody removed it (a surviving rank 0 would have)
            assert partials, what
    resumed = {r["resumed"] for r in job.last_exits()}
    assert resumed == {f"step_{newest}"}, what  # the newest complete one, never the partial
    assert job.partial_dirs() == [], what  # the relaunch's saves swept the dead writer's staging dirs
    assert job.complete_checkpoints() == list(range(EVERY, MAX_STEPS + 1, EVERY))
    assert_bitwise_equal(reference(job.world).final_weights(), job.final_weights())


@pytest.mark.parametrize("trial, kind", [(0, "external"), (1, "external-save"), (2, "self")])
def test_sigkill_one_process_relaunch_resumes_complete_checkpoint(shards, reference, tmp_path, trial, kind):
    rng = random.Random(f"{SEED}-kill-w1-{trial}")
    if kind == "self":
        kind = "self:" + rng.choice(SELF_POINTS)
    kill_trial(Job(tmp_path, shards, world=1), kind, rng, reference)


LONG_KINDS = ["external", "external-save", *(f"self:{p}" for p in SELF_POINTS), "external", "external-save",
              "self:save:staged"]


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("trial", range(10))
def test_sigkill_two_ranks_relaunch_resumes_complete_checkpoint(shards, reference, tmp_path, trial):
    rng = random.Random(f"{SEED}-kill-w2-{trial}")
    kill_trial(Job(tmp_path, shards, world=2), LONG_KINDS[trial], rng, reference)
