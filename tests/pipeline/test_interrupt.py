"""Interrupts end quietly: SIGTERM to a real `doit` while a worker runs stops the worker (forwarded to its process
group), prints one line (the task, the worker's exit code, the checkpoint it left), no Python traceback, and doit
exits with the worker's code; nothing is published, no receipt, and the next run builds the task."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from pipeline_toy import calls, doit, make_toy, ran, write


def test_sigterm_to_doit_prints_one_line_and_no_traceback(tmp_path):
    toy = make_toy(tmp_path / "toy")
    assert doit(toy, "ingest").returncode == 0
    write(toy, "configs/toy/shards.toml", """
        [job]
        suffix = "#"
        sleep_s = 60.0
        checkpoint = true
    """)
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env.pop("ALIGN_HEAVY_LOCK", None)
    proc = subprocess.Popen([sys.executable, "-m", "doit", "-f", str(toy / "dodo.py"), "profile=toy", "shards"],
                            cwd=toy, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    writing = toy / "runs" / "toy" / "shards" / "WRITING"
    deadline = time.monotonic() + 60
    while not writing.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert writing.exists(), proc.communicate()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err and "Traceback" not in out
    lines = [ln for ln in err.splitlines() if ln.startswith("align: ")]
    assert lines == ["align: shards: interrupted; worker exited 143; it left checkpoint "
                     "runs/toy/shards/checkpoints/step_1 (the next run resumes from it)"], err
    assert not (toy / "runs" / "toy" / "shards" / "out").exists()
    assert not (toy / "runs" / "toy" / "receipts" / "shards.json").exists()

    write(toy, "configs/toy/shards.toml", """
        [job]
        suffix = "#"
    """)
    seen = calls(toy)
    res = doit(toy)
    assert res.returncode == 0, res.stderr
    assert ran(toy, seen) == ["shards"]
