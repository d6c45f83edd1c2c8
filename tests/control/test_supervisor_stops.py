"""The supervisor gives up on the real SFT worker, and says why: a worker that crashes before making progress is not
relaunched; one that crashes after progress each time is relaunched until the retry budget is spent. A hang after
the first step ends at the shortened collective timeout with the evidence in the run directory's log, while the
same stall during the first step (start-up) is waited out under the long one. A stop forwarded by the supervisor
to a torchrun job gets to finish a checkpoint that takes longer than torchrun's own 30 s grace."""

from __future__ import annotations

import signal

import pytest

from control_helpers import TIMEOUT_S, Job, fault_lines


def test_crash_without_progress_is_not_relaunched(shards, tmp_path):
    job = Job(tmp_path, shards, world=1, faults="crash@micro,step=1")
    code = job.supervised(retries=2)
    log = job.log.read_text()
    assert code == 1 and job.attempts() == 1, job.log_tail()
    assert "supervisor: stop: exit 1 without progress" in log
    assert "FaultInjected: injected crash" in log  # the worker's own traceback is in the log beside the verdict
    assert job.history() == [] and job.complete_checkpoints() == []


@pytest.mark.slow  # three launches; the budget logic itself is unit-tested in tests/foundation/test_supervisor.py
def test_crash_after_progress_each_time_stops_at_the_retry_budget(shards, tmp_path):
    job = Job(tmp_path, shards, world=1,
              faults="crash@micro,step=3,once;crash@micro,step=5,once;crash@micro,step=7,once")
    code = job.supervised(retries=2)
    log = job.log.read_text()
    assert code == 1 and job.attempts() == 3, job.log_tail()  # the first launch and two relaunches
    assert log.count("exited 1 after progress; relaunch") == 2
    assert "supervisor: stop: exit 1; retry budget spent" in log
    assert [(e["step"], e["resumed"]) for e in job.exits()] == [(2, None), (4, "step_2"), (6, "step_4")]
    assert job.complete_checkpoints() == [2, 4, 6]
    assert not (job.run_dir / "final").exists()


@pytest.mark.distributed
def test_hang_after_the_first_step_ends_at_the_short_collective_timeout(shards, tmp_path):
    # Rank 1 stalls 6 s in step 1 (start-up: the 1800 s timeout applies, the run goes on) and 12 s in step 3 (the
    # timeout is 4 s by then: rank 0's collective gives up). Without the shortening the run would finish.
    job = Job(tmp_path, shards, world=2, faults="delay:6@micro,step=1,rank=1;delay:12@micro,step=3,rank=1",
              overrides=("train.pg_timeout_after_first_step_s=4", "train.checkpoint_every=0"),
              env_extra={"ALIGN_PG_TIMEOUT_S": "1800"})
    code = job.supervised(retries=2)
    log = job.log.read_text()
    assert code == 1 and job.attempts() == 1, job.log_tail()
    assert [(f[0], f[4]) for f in fault_lines(log)] == [(1, 1), (1, 3)]
    assert len(job.history()) == 2  # steps 1 and 2 completed, step 3 never did
    rank0 = [e for e in job.exits() if e["rank"] == 0]
    assert len(rank0) == 1 and rank0[0]["code"] is None and rank0[0]["step"] == 2, job.exits()
    assert "timed out" in rank0[0]["error"].lower() or "timeout" in rank0[0]["error"].lower(), rank0[0]["error"]
    assert "supervisor: stop: exit 1 without progress" in log  # no checkpoint, so no relaunch into the same hang


@pytest.mark.slow  # 35 s of injected delay
@pytest.mark.distributed
def test_forwarded_stop_finishes_a_checkpoint_slower_than_torchruns_default_grace(shards, tmp_path):
    # SIGTERM to the supervisor (Ctrl-C on doit, a scheduler's stop) is forwarded to torchrun and both ranks. The
    # stop checkpoint takes 35 s (rank 0 stalls inside it); torchrun's default grace would SIGKILL the ranks at 30 s
    # and lose it. The supervisor's stop_grace_s (TORCH_ELASTIC_SHUTDOWN_TIMEOUT) lets it finish.
    job = Job(tmp_path, shards, world=2, faults="delay:35@save:staged,step=3+,rank=0",
              overrides=("train.checkpoint_every=0",))
    sup = job.supervise()
    try:
        job.wait_for(lambda: len(job.history()) >= 2, "two steps")
        sup.send_signal(signal.SIGTERM)
        code = sup.wait(timeout=TIMEOUT_S)
    finally:
        if sup.poll() is None:
            sup.kill()
    log = job.log.read_text()
    assert code != 0 and job.attempts() == 1 and "supervisor: stop: supervisor was signalled" in log, log[-3000:]
    [(code0, step0), (code1, step1)] = [(r["code"], r["step"]) for r in job.last_exits()]
    assert code0 == code1 == 143 and step0 == step1 >= 3, log[-3000:]
    assert job.complete_checkpoints() == [step0] and job.partial_dirs() == []
