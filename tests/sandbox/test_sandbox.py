"""align.sandbox: hostile programs, each contained; what the kernel's layers hold without the audit hook; tests as
a reward. Every run is a real child interpreter (~0.1-0.2 s)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from align.sandbox.code_tests import TestFileError, code_reward, extract_program, split_tests
from align.sandbox.run import HOME_PREFIX, ORPHAN_AGE_S, SandboxConfig, run_python, sweep_orphan_homes

FAST = SandboxConfig(timeout_s=3.0, cpu_s=2)
KERNEL_ONLY = SandboxConfig(timeout_s=3.0, cpu_s=2, audit=False)
REPO = Path(__file__).resolve().parents[2]


def program(src: str, *tests: str, cfg: SandboxConfig = FAST):
    return run_python([("program", src), *(("test", t) for t in tests)], cfg)


def session_alive(sid: int, wait_s: float = 5.0) -> list[int]:
    """Live (not zombie) processes whose session id is `sid`, the harness's: all must be gone after a run (SIGKILL
    is delivered asynchronously, so they are given `wait_s` to go: a bound on a poll, not a timing assertion)."""
    deadline = time.monotonic() + wait_s
    while True:
        alive = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rpartition(")")[2].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] != "Z":  # after the command: state ppid pgrp session
                alive.append(int(stat.parent.name))
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def test_honest_program_passes_and_fails_its_tests():
    r = program("def add(a, b):\n    return a + b\nprint('ok')", "assert add(1, 2) == 3", "assert add(1, 2) == 4")
    assert r.tests == (True, False) and r.program_ok and r.finished and not r.timed_out
    assert r.stdout == b"ok\n" and r.fraction() == 0.5
    assert session_alive(r.pid) == []


def test_program_exit_or_exception_fails_every_test():
    r = program("import sys\nsys.exit(0)", "assert True")
    assert r.tests == (False,) and not r.program_ok
    r = program("raise ValueError('x')", "assert True")
    assert r.tests == (False,) and b"ValueError" in r.stderr


def test_forged_result_lines_do_not_count():
    """A program that writes verdict lines to every descriptor (without the nonce) gains nothing."""
    forged = "import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'x test 0 1\\nx done\\n')\n" \
             "    except OSError:\n        pass\nprint('test 0 1')"
    r = program(forged, "assert False")
    assert r.tests == (False,)


def test_fork_bomb_is_contained():
    r = program("import os\nwhile True:\n    os.fork()", "assert True")
    assert not r.program_ok and b"os.fork refused" in r.stderr and not r.timed_out
    assert session_alive(r.pid) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="RLIMIT_NPROC binds the sandbox's own user only when it runs as nobody")
def test_fork_bomb_without_the_audit_hook_hits_the_process_limit():
    r = program("import os\nn = 0\nwhile True:\n    try:\n        os.fork()\n        n += 1\n"
                "    except OSError:\n        break\nprint('forks', n, flush=True)\nimport time\ntime.sleep(60)",
                cfg=KERNEL_ONLY)
    assert r.layers.get("uid") and not r.layers.get("audit")
    forks = [int(line.split()[1]) for line in r.stdout.decode().splitlines() if line.startswith("forks")]
    assert forks and max(forks) < KERNEL_ONLY.max_processes  # every process of the bomb hit the limit
    assert r.timed_out and session_alive(r.pid) == []  # killed at the wall clock, every child with it


def test_infinite_loop_hits_the_cpu_limit():
    r = program("while True:\n    pass", "assert True", cfg=SandboxConfig(timeout_s=5.0, cpu_s=1))
    assert r.tests == (False,) and not r.timed_out and r.exit_code == 128 + 24  # SIGXCPU, not the wall clock


def test_sleeping_program_is_killed_at_the_wall_clock():
    r = program("import time\ntime.sleep(60)", "assert True", cfg=SandboxConfig(timeout_s=1.0))
    assert r.timed_out and r.exit_code is None and r.tests == (False,) and session_alive(r.pid) == []


def test_huge_output_is_bounded():
    cfg = SandboxConfig(timeout_s=1.5, max_output_bytes=1000)
    r = program("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", cfg=cfg)
    assert len(r.stdout) == 1000 and r.output_dropped > 1000 and r.timed_out


def test_memory_bomb_gets_memory_error():
    r = program("x = bytearray(1 << 33)", "assert True", cfg=SandboxConfig(timeout_s=3.0, memory_mb=256))
    assert not r.program_ok and b"MemoryError" in r.stderr and r.tests == (False,)
    r = program("chunks = []\nwhile True:\n    chunks.append(bytearray(1 << 24))", cfg=SandboxConfig(memory_mb=256))
    assert not r.program_ok and b"MemoryError" in r.stderr


def test_signals_to_the_trainer_are_refused():
    me = os.getpid()
    for src in (f"import os, signal\nos.kill({me}, signal.SIGTERM)", "import os, signal\nos.kill(os.getppid(), 9)",
                "import os, signal\nos.killpg(0, signal.SIGKILL)"):
        r = program(src)
        assert not r.program_ok and b"refused" in r.stderr
    r = program(f"import os, signal\nos.kill({me}, signal.SIGTERM)", cfg=KERNEL_ONLY)
    if r.layers.get("pidns") or r.layers.get("uid"):  # the trainer is not in the namespace, or not nobody's
        assert not r.program_ok and (b"ProcessLookupError" in r.stderr or b"PermissionError" in r.stderr)
    assert os.getpid() == me  # still here


def test_reads_outside_the_sandbox_are_refused_by_the_audit_hook():
    for path in ("/etc/passwd", str(REPO / "pyproject.toml"), "../../etc/passwd"):
        r = program(f"print(open({path!r}).read())")
        assert not r.program_ok and b"outside the sandbox" in r.stderr and b"root" not in r.stdout
    r = program("import os\nos.symlink('/etc/passwd', 'p')\nprint(open('p').read())")
    assert not r.program_ok
    r = program("open('/tmp/align-sandbox-escape', 'w').write('x')")
    assert not r.program_ok and not Path("/tmp/align-sandbox-escape").exists()
    r = program("open('mine.txt', 'w').write('x')\nassert open('mine.txt').read() == 'x'", "assert True")
    assert r.tests == (True,)  # its own directory is its own


@pytest.mark.skipif(os.geteuid() != 0, reason="the uid layer exists only when the trainer runs as root")
def test_without_the_audit_hook_world_readable_files_stay_readable():
    """The honest limit: as nobody the program cannot read root-only files, but /etc/passwd is world-readable."""
    r = program("print(open('/etc/passwd').read()[:4])", cfg=KERNEL_ONLY)
    assert r.program_ok and r.stdout.startswith(b"root")
    r = program("import os\nprint(os.listdir('/root'))", cfg=KERNEL_ONLY)
    assert not r.program_ok and b"PermissionError" in r.stderr


def test_no_network():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(2.0)
    port = server.getsockname()[1]
    connected: list = []
    threading.Thread(target=lambda: connected.append(_accept(server)), daemon=True).start()
    src = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)"
    r = program(src)
    assert not r.program_ok and b"refused" in r.stderr
    # the kernel alone (no hook, and no uid drop, so that `socket` imports from a stdlib only root may read)
    r = program(src, cfg=SandboxConfig(timeout_s=3.0, audit=False, drop_uid=False))
    if r.layers.get("netns"):
        assert not r.program_ok and b"Network is unreachable" in r.stderr
    time.sleep(0.2)
    assert connected in ([], [None])  # nothing reached the host's loopback
    server.close()


def _accept(server):
    try:
        return server.accept()
    except OSError:
        return None


def test_large_file_is_refused():
    r = program("open('big', 'wb').write(b'x' * (16 << 20))", cfg=SandboxConfig(file_size_mb=1))
    assert not r.program_ok and b"File too large" in r.stderr


# ------------------------------------------------------------------------------------------------ tests as reward

def test_split_tests_and_extract_program():
    steps = split_tests("import math\ndef check(f):\n    assert f(2) == 4\ncheck(sq)\nassert sq(3) == 9")
    assert [k for k, _ in steps] == ["setup", "setup", "test", "test"]
    with pytest.raises(TestFileError):
        split_tests("def f(:")
    with pytest.raises(TestFileError):
        split_tests("x = 1")
    text = "first\n```python\ndef a(): pass\n```\nthen\n```py\ndef sq(x):\n    return x * x\n```\n"
    assert extract_program(text) == "def sq(x):\n    return x * x\n"
    assert extract_program("no code") is None and extract_program("x = 1", "whole") == "x = 1"


def test_code_reward_fraction_and_all():
    tests = "assert sq(2) == 4\nassert sq(3) == 9\nassert sq(-1) == -1"
    good = "```python\ndef sq(x):\n    return x * x\n```"
    v = code_reward(good, tests)
    assert v.reward == pytest.approx(2 / 3) and v.status == "partial"
    assert code_reward(good, tests, mode="all").reward == 0.0
    assert code_reward(good, "assert sq(2) == 4", mode="all").reward == 1.0
    assert code_reward("no code here", tests).status == "no_program"
    v = code_reward("```python\nwhile True: pass\n```", tests, SandboxConfig(timeout_s=1.0, cpu_s=5))
    assert v.reward == 0.0 and v.status == "timeout"


def test_a_killed_trainer_leaves_no_sandboxed_process():
    """The harness has the parent-death signal: the trainer SIGKILLed mid-run takes the program with it."""
    import signal

    src = ("from align.sandbox.run import run_python, SandboxConfig\n"
           "run_python([('program', 'import time\\ntime.sleep(60)')], SandboxConfig(timeout_s=60))")
    trainer = subprocess.Popen([sys.executable, "-c", src], cwd=REPO)
    harness = []
    deadline = time.monotonic() + 10
    while not harness and time.monotonic() < deadline:
        time.sleep(0.2)
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rpartition(")")[2].split()
            except OSError:
                continue
            if int(fields[1]) == trainer.pid:
                harness.append(int(stat.parent.name))
    assert harness, "the sandbox never started"
    time.sleep(0.5)  # the program is asleep inside it
    assert session_alive(harness[0], wait_s=0)
    home = Path(os.readlink(f"/proc/{harness[0]}/cwd"))  # the run's temporary home
    trainer.send_signal(signal.SIGKILL)
    trainer.wait()
    assert session_alive(harness[0]) == []
    # A SIGKILLed trainer never reaches run_python's cleanup: its home stays behind, named by its pid, until a later
    # process's first run sweeps it (here: once it is older than ORPHAN_AGE_S)
    assert home.is_dir() and home.name.startswith(f"{HOME_PREFIX}{trainer.pid}-")
    old = time.time() - ORPHAN_AGE_S - 1
    os.utime(home, (old, old))
    assert sweep_orphan_homes.__wrapped__() >= 1 and not home.exists()


def test_the_sweep_keeps_young_homes_and_live_owners(tmp_path, monkeypatch):
    """Only a home both orphaned (no live owner pid) and old is swept: a young one may be another PID namespace's
    live run, and a live owner's home is in use."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that is no live process now
    old = time.time() - ORPHAN_AGE_S - 1
    homes = {"orphan": tmp_path / f"{HOME_PREFIX}{dead.pid}-a", "young": tmp_path / f"{HOME_PREFIX}{dead.pid}-b",
             "live": tmp_path / f"{HOME_PREFIX}{os.getpid()}-c"}
    for name, home in homes.items():
        home.mkdir()
        if name != "young":
            os.utime(home, (old, old))
    (tmp_path / "unrelated").mkdir()
    assert sweep_orphan_homes.__wrapped__() == 1
    assert not homes["orphan"].exists() and homes["young"].is_dir() and homes["live"].is_dir()
    assert (tmp_path / "unrelated").is_dir()
