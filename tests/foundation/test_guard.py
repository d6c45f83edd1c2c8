"""align.utils.guard: preflight thresholds and the host's heavy-job lock (exclusive, refused at once, freed by the
kernel when the holder dies)."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from align.exceptions import PreflightRefused
from align.exit_codes import PREFLIGHT_REFUSED
from align.utils.guard import (HeavyJobLock, HostStatus, LockConfig, PreflightConfig, default_lock_path, lock_holder,
                               preflight, preflight_problems, resolve_lock_path)

HOLDER = textwrap.dedent("""
    import sys, time
    from align.utils.guard import HeavyJobLock
    lock = HeavyJobLock(sys.argv[1], command="holder-job --big").acquire()
    print("held", flush=True)
    time.sleep(120)
""")

CONTENDER = textwrap.dedent("""
    import sys
    from align.exit_codes import run_with_exit_codes
    from align.utils.guard import HeavyJobLock
    def main():
        with HeavyJobLock(sys.argv[1]):
            return 0
    raise SystemExit(run_with_exit_codes(main))
""")


def _start_holder(lock_path: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock_path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_problems_name_each_failed_check():
    status = HostStatus(mem_available_gib=1.0, free_disk_gib=5.0, load_per_cpu=3.0, free_gpu_gib=(10.0, 2.0))
    cfg = PreflightConfig(min_mem_available_gib=4.0, min_free_disk_gib=1.0, max_load_per_cpu=2.0, min_free_gpu_gib=8.0)
    problems = preflight_problems(cfg, status)
    assert len(problems) == 3
    assert "MemAvailable 1.0 GiB < 4.0" in problems[0]
    assert "load per CPU 3.00 > 2.0" in problems[1]
    assert problems[2].startswith("GPU 1 free memory 2.0 GiB")
    assert preflight_problems(PreflightConfig(None, None, None, None), status) == []


def test_preflight_measures_this_host(tmp_path):
    status = preflight(PreflightConfig(min_mem_available_gib=0.01, min_free_disk_gib=0.001), tmp_path / "not" / "yet")
    assert status.free_disk_gib > 0 and status.mem_available_gib > 0
    with pytest.raises(PreflightRefused) as err:
        preflight(PreflightConfig(min_free_disk_gib=1e9), tmp_path)
    assert err.value.exit_code == PREFLIGHT_REFUSED == 83
    assert "free disk" in str(err.value)


def test_lock_path_resolution(monkeypatch, tmp_path):
    monkeypatch.delenv("ALIGN_HEAVY_LOCK", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert default_lock_path() == tmp_path / "cache" / "align" / "heavy-job.lock"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert not str(default_lock_path()).startswith("/tmp")
    monkeypatch.setenv("ALIGN_HEAVY_LOCK", str(tmp_path / "env.lock"))
    assert resolve_lock_path(LockConfig()) == tmp_path / "env.lock"
    assert resolve_lock_path(LockConfig(path=str(tmp_path / "cfg.lock"))) == tmp_path / "cfg.lock"


def test_second_holder_refused_naming_pid_and_command(tmp_path):
    lock_path = tmp_path / "heavy.lock"
    holder = _start_holder(lock_path)
    try:
        with pytest.raises(PreflightRefused) as err:
            HeavyJobLock(lock_path).acquire()
        assert f"pid {holder.pid}" in str(err.value) and "holder-job --big" in str(err.value)
        assert lock_holder(lock_path)["pid"] == holder.pid
        # A second process gets exit 83 and one line on stderr, no traceback.
        res = subprocess.run([sys.executable, "-c", CONTENDER, str(lock_path)], capture_output=True, text=True,
                             timeout=60)
        assert res.returncode == 83
        assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
        assert f"pid {holder.pid}" in res.stderr
    finally:
        holder.kill()
        holder.wait()


def test_sigkilled_holder_frees_the_lock(tmp_path):
    lock_path = tmp_path / "heavy.lock"
    holder = _start_holder(lock_path)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    assert lock_holder(lock_path) is None
    with HeavyJobLock(lock_path, command="next") as lock:
        assert lock.held and lock_holder(lock_path)["command"] == "next"
    assert lock_holder(lock_path) is None and lock_path.read_text() == ""  # record cleared on release


def test_lock_handed_to_a_child_outlives_the_parent_handle(tmp_path):
    """The launcher passes the lock's descriptor to the worker: the lock lasts as long as the heavy job."""
    lock_path = tmp_path / "heavy.lock"
    lock = HeavyJobLock(lock_path).acquire()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], pass_fds=(lock.fileno(),))
    try:
        os.close(lock._fd)  # the parent dies (its descriptor closes) while the worker runs
        lock._fd = None
        with pytest.raises(PreflightRefused):
            HeavyJobLock(lock_path).acquire()
    finally:
        child.kill()
        child.wait()
    deadline = time.monotonic() + 10
    while lock_holder(lock_path) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    HeavyJobLock(lock_path).acquire().release()
