"""Run untrusted Python (a model's program and its tests) in a child process, bounded: `run_python`.

The child is a fresh `python -I -S -B` (no repository, no site-packages, no bytecode written) running
align/sandbox/harness.py in a fresh temporary directory (its cwd and HOME, removed afterwards; one a SIGKILLed caller
left behind is removed by the next process's first run, `sweep_orphan_homes`), in its own session
(process group), with an almost empty environment. Layers, each reported in `SandboxResult.layers`:

    netns       a new network namespace: no interface but a down loopback, so no connection leaves (root, or an
                unprivileged user namespace where the kernel allows one; else absent)
    pidns       a new PID namespace: the program sees no outside process (it cannot signal the trainer) and every
                process it leaves dies with the namespace's PID 1
    uid         as root, the program runs as nobody (65534): RLIMIT_NPROC then binds (root is exempt), root-only
                files close; not as another user
    rlimits     CPU seconds, address space, file size, processes, 64 descriptors, no core file (always)
    audit       a CPython audit hook refusing sockets, fork/exec/spawn, kill, ctypes, and paths outside the working
                directory (writes) or the standard library (reads) (always)
    wall clock  the parent kills the whole process group at `timeout_s`; stdout / stderr are read concurrently and
                kept up to `max_output_bytes` each (the rest is drained and counted, never buffered)

What this sandbox is NOT: a security boundary against a determined attacker. It shares the kernel with the trainer
(no seccomp filter, no mount namespace or chroot, no cgroup: memory is bounded per process by RLIMIT_AS, not for
the whole tree); the audit hook lives in the attacked interpreter, and CPython documents audit hooks as unfit for
sandboxing (a memory-safety bug or an unlisted C module gets past it). Without the hook, reads of world-readable
files (/etc/passwd, a world-readable repository) are stopped by nothing. A program can also game its own tests:
it runs in the same interpreter as the asserts (it may redefine `AssertionError`, patch builtins, or find the
result nonce by introspection). It is meant for a model's honest mistakes and casual reward hacking during RL
(loops, exits, prints, forks, memory), on a machine whose secrets it does not hold. Run it inside a VM or a
gVisor/firecracker container where the programs are adversarial."""

from __future__ import annotations

import functools
import json
import os
import secrets
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from align.sandbox import harness

HARNESS = Path(harness.__file__)  # run as a script in the child; imported here so that it counts in code digests
NOBODY = 65534


@dataclass(frozen=True)
class SandboxConfig:
    """Bounds of one run (the `code_tests` reward term's options)."""

    timeout_s: float = 5.0  # wall clock for the whole run; the process group is killed at it
    cpu_s: int = 4  # RLIMIT_CPU (SIGXCPU, then SIGKILL one second later)
    memory_mb: int = 512  # RLIMIT_AS of the program's process
    file_size_mb: int = 8  # RLIMIT_FSIZE (a larger write gets SIGXFSZ)
    max_processes: int = 8  # RLIMIT_NPROC (counts the user's processes: as nobody, few; as another user, all)
    max_output_bytes: int = 1 << 16  # kept of stdout and of stderr each; the rest is read and dropped
    namespaces: bool = True  # new network + PID namespaces where the kernel allows
    drop_uid: bool = True  # as root, run the program as nobody
    audit: bool = True  # the audit hook; off only to show what the kernel's layers hold alone (tests/sandbox)

    def __post_init__(self):
        for name in ("timeout_s", "cpu_s", "memory_mb", "file_size_mb", "max_processes", "max_output_bytes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SandboxConfig.{name} must be > 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class SandboxResult:
    tests: tuple[bool, ...]  # one verdict per test step, in order (a test never reached is False)
    program_ok: bool  # the program's own code ran without an exception
    finished: bool  # the harness reached its end (every test ran)
    timed_out: bool  # killed at the wall clock
    exit_code: int | None  # the harness's code (128 + N: signal N); None when killed
    stdout: bytes
    stderr: bytes
    output_dropped: int  # bytes of stdout + stderr read and not kept
    layers: dict = field(default_factory=dict)  # netns, pidns, userns, uid, audit: which layers held
    seconds: float = 0.0
    pid: int = 0  # the harness's pid = its process group and session id (killed and reaped before return)

    @property
    def passed(self) -> int:
        return sum(self.tests)

    def fraction(self) -> float:
        return self.passed / len(self.tests) if self.tests else 0.0


@functools.lru_cache(maxsize=1)
def readable_roots() -> tuple[str, ...]:
    """The standard library's directories: the only paths outside its cwd the program may read (audit layer)."""
    paths = sysconfig.get_paths()
    roots = {paths["stdlib"], paths["platstdlib"], os.path.join(sys.base_exec_prefix, "lib"),
             "/dev/null", "/dev/urandom", "/dev/zero"}
    return tuple(sorted(os.path.realpath(r) for r in roots if r))


@functools.lru_cache(maxsize=1)
def others_can_read_stdlib() -> bool:
    """Whether nobody could import from the standard library (every directory on the way searchable by others, the
    library's own directories readable): if not (an interpreter under /root), the harness preloads common modules
    before it drops to nobody, which costs ~0.1 s per run."""
    for root in readable_roots():
        if root.startswith("/dev/"):
            continue
        path = Path(root)
        for folder in (path, *path.parents):
            mode = folder.stat().st_mode if folder.exists() else 0
            if not mode & stat.S_IXOTH or (folder == path and not mode & stat.S_IROTH):
                return False
    return True


HOME_PREFIX = "align-sandbox-"  # then the owner's pid: <tmp>/align-sandbox-<pid>-<random>
ORPHAN_AGE_S = 600.0  # a home is swept only this long after its last change: another PID namespace's live run may
# share the temporary directory with a pid that means nothing here, and a run lives timeout_s (default 5 s)


@functools.lru_cache(maxsize=1)
def sweep_orphan_homes() -> int:
    """Remove the homes that SIGKILLed callers left behind (run_python's cleanup never ran): those whose owner pid is
    no live process and that are older than ORPHAN_AGE_S. Once per process, before its first run. Returns how many."""
    swept = 0
    for home in Path(tempfile.gettempdir()).glob(f"{HOME_PREFIX}*-*"):
        pid = home.name[len(HOME_PREFIX):].split("-", 1)[0]
        try:
            age = time.time() - home.lstat().st_mtime
        except OSError:
            continue
        if pid.isdigit() and not _alive(int(pid)) and age > ORPHAN_AGE_S and home.is_dir() and not home.is_symlink():
            shutil.rmtree(home, ignore_errors=True)
            swept += 1
    return swept


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def run_python(steps: list[tuple[str, str]], cfg: SandboxConfig = SandboxConfig()) -> SandboxResult:
    """Run `steps` ([(kind, source)], kind "program" | "setup" | "test") in one sandboxed interpreter."""
    nonce = secrets.token_hex(16)
    job = {"nonce": nonce, "steps": [list(s) for s in steps], "namespaces": cfg.namespaces, "drop_uid": cfg.drop_uid,
           "audit": cfg.audit, "preload": os.geteuid() == 0 and cfg.drop_uid and not others_can_read_stdlib(),
           "readable": list(readable_roots()),
           "limits": {"cpu_s": cfg.cpu_s, "memory_mb": cfg.memory_mb, "file_size_mb": cfg.file_size_mb,
                      "max_processes": cfg.max_processes}}
    n_tests = sum(1 for kind, _ in steps if kind == "test")
    sweep_orphan_homes()
    home = tempfile.mkdtemp(prefix=f"{HOME_PREFIX}{os.getpid()}-")  # removed below, or by a later process's sweep
    if os.geteuid() == 0 and cfg.drop_uid:
        os.chown(home, NOBODY, NOBODY)  # the program's cwd is its own, as nobody
    result_r, result_w = os.pipe()
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen([sys.executable, "-I", "-S", "-B", str(HARNESS), str(result_w)], cwd=home,
                                env={"PATH": "/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8", "TMPDIR": home},
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                pass_fds=(result_w,), start_new_session=True)
        os.close(result_w)
        result_w = -1
        try:
            proc.stdin.write(json.dumps(job).encode())
            proc.stdin.close()
        except BrokenPipeError:  # the harness died before reading its job: reported by its exit code
            pass
        out, err, results, dropped, timed_out = _collect(proc, result_r, cfg, t0 + cfg.timeout_s)
        _kill_group(proc)
        code = None if timed_out else proc.wait()
    finally:
        if result_w >= 0:
            os.close(result_w)
        os.close(result_r)
        shutil.rmtree(home, ignore_errors=True)
    return _verdicts(results, nonce, n_tests, out, err, dropped, timed_out, code, time.monotonic() - t0, proc.pid)


def _collect(proc: subprocess.Popen, result_r: int, cfg: SandboxConfig, deadline: float):
    """Read stdout, stderr and the result pipe until all three close or the deadline passes."""
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    keep = {out_fd: bytearray(), err_fd: bytearray(), result_r: bytearray()}
    sel = selectors.DefaultSelector()
    for fd in keep:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    dropped, open_fds, timed_out = 0, set(keep), False
    while open_fds:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        for key, _ in sel.select(timeout=min(left, 0.5)):
            chunk = os.read(key.fd, 1 << 16)
            if not chunk:
                sel.unregister(key.fd)
                open_fds.discard(key.fd)
                continue
            buf = keep[key.fd]
            limit = cfg.max_output_bytes if key.fd != result_r else 1 << 20
            room = max(0, limit - len(buf))
            buf += chunk[:room]
            dropped += len(chunk) - min(room, len(chunk))
    sel.close()
    proc.stdout.close()
    proc.stderr.close()
    return bytes(keep[out_fd]), bytes(keep[err_fd]), bytes(keep[result_r]), dropped, timed_out


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the harness's process group (whatever the program left behind in it), then reap the harness."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:  # NOTE: a process in uninterruptible sleep; it is reaped by init later
        pass


def _verdicts(results: bytes, nonce: str, n_tests: int, out: bytes, err: bytes, dropped: int, timed_out: bool,
              code: int | None, seconds: float, pid: int) -> SandboxResult:
    tests, layers, program_ok, finished = [False] * n_tests, {}, True, False
    for line in results.decode(errors="replace").splitlines():
        head, _, rest = line.partition(" ")
        if head != nonce:
            continue
        event, _, arg = rest.partition(" ")
        if event == "layers":
            layers.update(json.loads(arg))
        elif event == "uid":
            layers["uid"], layers["audit"] = arg.startswith("1"), arg.endswith("a")  # "<0|1>[a]"
        elif event == "program":
            program_ok = False
        elif event == "test":
            index, _, verdict = arg.partition(" ")
            if index.isdigit() and int(index) < n_tests:
                tests[int(index)] = verdict == "1"
        elif event == "done":
            finished = True
    if code is not None and code < 0:
        code = 128 - code
    return SandboxResult(tuple(tests), program_ok, finished and code == 0, timed_out, code, out, err, dropped,
                         layers, seconds, pid)
