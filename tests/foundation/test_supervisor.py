"""align.utils.supervisor: relaunch only after progress and never after a verdict; the child's process group is
emptied before any relaunch; signals to the supervisor are forwarded, not acted on alone."""

import io
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from align.exceptions import PreflightRefused
from align.utils.manifest import write_manifest
from align.utils.supervisor import (ProgressMark, SupervisorConfig, group_members, made_progress,
                                    newest_complete_checkpoint, stop_reason, supervise)

LAUNCH = re.compile(r"^supervisor: attempt \d+: ", re.M)
FAST = SupervisorConfig(max_retries=2, backoff_s=0.0, kill_grace_s=2.0)

# A worker that counts its attempts in <run_dir>/attempts and behaves as told by argv[2] for that attempt number.
WORKER = textwrap.dedent("""
    import json, os, subprocess, sys, time
    from pathlib import Path
    from align.exit_codes import write_halt_marker
    from align.utils.manifest import write_manifest
    run_dir, plan = Path(sys.argv[1]), sys.argv[2].split(",")
    counter = run_dir / "attempts"
    n = int(counter.read_text()) + 1 if counter.exists() else 1
    counter.write_text(str(n))
    action = plan[min(n, len(plan)) - 1]
    print(f"attempt {n}: {action}", flush=True)
    if action in ("progress-crash", "progress-ok"):
        with open(run_dir / "history.jsonl", "a") as f:
            f.write(json.dumps({"step": n}) + "\\n")
        ckpt = run_dir / "checkpoints" / f"step_{n}"
        ckpt.mkdir(parents=True)
        (ckpt / "w.bin").write_bytes(b"x" * n)
        write_manifest(ckpt, "checkpoint")
        raise SystemExit(0 if action == "progress-ok" else 1)
    if action == "halt-collapsed":
        write_halt_marker(run_dir, 81, "skip cap")
        raise SystemExit(1)  # torchrun reports 1 whatever the worker said
    if action == "orphan":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        (run_dir / "orphan.pid").write_text(str(child.pid))
        raise SystemExit(1)
    if action == "sleep":
        (run_dir / "ready").write_text("1")
        time.sleep(120)
    raise SystemExit(int(action))
""")


def _run(tmp_path, plan, config=FAST, **kw):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    log = io.BytesIO()
    result = supervise([sys.executable, str(script), str(tmp_path), plan], tmp_path, config=config, log=log,
                       echo=io.BytesIO(), **kw)
    return result, log.getvalue().decode()


@pytest.mark.parametrize("code, halt, retries, progressed, signalled, relaunch", [
    (0, None, 2, True, False, False),
    (1, None, 2, True, False, True),
    (137, None, 1, True, False, True),
    (1, None, 0, True, False, False),  # budget spent
    (1, None, 2, False, False, False),  # no progress
    (80, None, 2, True, False, False), (81, None, 2, True, False, False), (82, None, 2, True, False, False),
    (83, None, 2, True, False, False), (2, None, 2, True, False, False),
    (1, {"exit_code": 81}, 2, True, False, False),  # fresh HALT.json behind a collapsed exit code
    (143, None, 2, True, True, False),  # the supervisor itself was told to stop
])
def test_stop_reason(code, halt, retries, progressed, signalled, relaunch):
    assert (stop_reason(code, halt, retries, progressed, signalled) is None) == relaunch


def test_progress_needs_history_and_a_newer_complete_checkpoint(tmp_path):
    assert not made_progress(ProgressMark(None, None), ProgressMark((10, 1), None))
    assert not made_progress(ProgressMark((10, 1), 5), ProgressMark((10, 1), 6))
    assert not made_progress(ProgressMark((10, 1), 5), ProgressMark((20, 2), 5))
    assert made_progress(ProgressMark(None, None), ProgressMark((20, 2), 1))
    for step in (1, 2, 3):
        d = tmp_path / "checkpoints" / f"step_{step}"
        d.mkdir(parents=True)
        (d / "w.bin").write_bytes(b"abc")
        if step < 3:
            write_manifest(d, "checkpoint")
    (tmp_path / "checkpoints" / "step_2" / "w.bin").write_bytes(b"a")  # truncated after its manifest
    assert newest_complete_checkpoint(tmp_path) == 1  # step_3 has no manifest, step_2 fails its size check


def test_relaunches_after_progress_until_success(tmp_path):
    result, log = _run(tmp_path, "progress-crash,progress-crash,progress-ok")
    assert result.exit_code == 0 and len(result.attempts) == 3
    assert [a.progressed for a in result.attempts] == [True, True, True]
    assert len(LAUNCH.findall(log)) == 3 and "attempt 3: progress-ok" in log


def test_retry_budget_is_bounded(tmp_path):
    result, _ = _run(tmp_path, "progress-crash")
    assert result.exit_code == 1 and len(result.attempts) == 3 and "retry budget spent" in result.reason


def test_no_progress_no_relaunch(tmp_path):
    result, log = _run(tmp_path, "1")
    assert result.exit_code == 1 and len(result.attempts) == 1
    assert "without progress" in result.reason and "supervisor: stop" in log


@pytest.mark.parametrize("plan, code", [("82", 82), ("halt-collapsed", 81), ("80", 80)])
def test_verdicts_are_not_relaunched(tmp_path, plan, code):
    (tmp_path / "HALT.json").write_text('{"exit_code": 80}')  # a stale marker from an earlier run does not count
    os.utime(tmp_path / "HALT.json", (time.time() - 3600,) * 2)
    result, _ = _run(tmp_path, f"progress-crash,{plan}")  # progress first, then the verdict
    assert result.exit_code == code and len(result.attempts) == 2


def test_preflight_after_backoff_can_refuse_the_relaunch(tmp_path):
    def refuse():
        raise PreflightRefused("MemAvailable 1.0 GiB < 45 GiB")

    result, _ = _run(tmp_path, "progress-crash", preflight=refuse)
    assert len(result.attempts) == 1 and "relaunch refused by preflight" in result.reason


def test_group_is_killed_and_empty_before_returning(tmp_path):
    result, _ = _run(tmp_path, "orphan")
    orphan = int((tmp_path / "orphan.pid").read_text())
    assert result.exit_code == 1
    stat = open(f"/proc/{orphan}/stat").read() if os.path.exists(f"/proc/{orphan}") else ""
    assert stat == "" or stat[stat.rindex(")") + 2] == "Z"  # gone (or a zombie awaiting a reaper)
    assert group_members(orphan) == []


def test_cli_forwards_sigterm_and_does_not_relaunch(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    sup = subprocess.Popen([sys.executable, "-m", "align.utils.supervisor", "--run-dir", str(tmp_path),
                            "--backoff", "0", "--", sys.executable, str(script), str(tmp_path), "sleep"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while not (tmp_path / "ready").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    sup.send_signal(signal.SIGTERM)
    out, _ = sup.communicate(timeout=60)
    assert sup.returncode == 128 + signal.SIGTERM, out
    assert len(LAUNCH.findall(out)) == 1 and "supervisor was signalled" in out
