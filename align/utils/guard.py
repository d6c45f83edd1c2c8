"""Host guards for heavy jobs: a preflight of the host's resources and one exclusive heavy-job lock per host.

Stdlib only: the pipeline's launcher and the supervisor run these in processes that never import torch. Every
refusal is a `PreflightRefused` (exit 83) whose message says which check failed, by how much, or who holds the lock.

The lock is an exclusive, non-blocking `flock` on one file. The kernel releases it when the last descriptor of the
holder's open file closes, i.e. when the holder dies by any means (SIGKILL included): there is no stale-lock cleanup,
and the file is never unlinked (unlinking would let two holders lock two different inodes under one name)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from align.exceptions import PreflightRefused
from align.utils.fsio import free_bytes, human_bytes

LOCK_ENV = "ALIGN_HEAVY_LOCK"
_GIB = 1024 ** 3


@dataclass(frozen=True)
class PreflightConfig:
    """Thresholds a host must meet before a heavy job starts. `None` disables a check."""

    min_mem_available_gib: float | None = 2.0  # /proc/meminfo MemAvailable
    min_free_disk_gib: float | None = 1.0  # on the filesystem that holds the run directory
    max_load_per_cpu: float | None = None  # 1-minute load average divided by the CPU count
    min_free_gpu_gib: float | None = None  # per visible GPU, when there is one


@dataclass(frozen=True)
class LockConfig:
    """Where the host's heavy-job lock lives. Empty path: $ALIGN_HEAVY_LOCK, else the user's cache directory."""

    path: str = ""


@dataclass(frozen=True)
class HostStatus:
    mem_available_gib: float | None
    free_disk_gib: float
    load_per_cpu: float
    free_gpu_gib: tuple[float, ...]


# ---------------------------------------------------------------------------------------------------- preflight

def mem_available_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 / _GIB
    except OSError:
        pass
    return None  # not Linux: the check is skipped, not faked


def free_gpu_gib() -> tuple[float, ...]:
    """Free memory of each visible GPU via nvidia-smi (no torch import); empty when there is no NVIDIA GPU."""
    if shutil.which("nvidia-smi") is None:
        return ()
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(float(v) / 1024 for v in out.split() if v.strip())


def host_status(run_dir: str | os.PathLike) -> HostStatus:
    probe = Path(run_dir)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent  # the run directory may not exist yet; its filesystem does
    return HostStatus(
        mem_available_gib=mem_available_gib(),
        free_disk_gib=shutil.disk_usage(probe).free / _GIB,
        load_per_cpu=os.getloadavg()[0] / (os.cpu_count() or 1),
        free_gpu_gib=free_gpu_gib(),
    )


def preflight_problems(cfg: PreflightConfig, status: HostStatus) -> list[str]:
    problems = []
    if cfg.min_mem_available_gib is not None and status.mem_available_gib is not None \
            and status.mem_available_gib < cfg.min_mem_available_gib:
        problems.append(f"MemAvailable {status.mem_available_gib:.1f} GiB < {cfg.min_mem_available_gib} GiB")
    if cfg.min_free_disk_gib is not None and status.free_disk_gib < cfg.min_free_disk_gib:
        problems.append(f"free disk {status.free_disk_gib:.1f} GiB < {cfg.min_free_disk_gib} GiB")
    if cfg.max_load_per_cpu is not None and status.load_per_cpu > cfg.max_load_per_cpu:
        problems.append(f"1-min load per CPU {status.load_per_cpu:.2f} > {cfg.max_load_per_cpu}")
    if cfg.min_free_gpu_gib is not None:
        for i, free in enumerate(status.free_gpu_gib):
            if free < cfg.min_free_gpu_gib:
                problems.append(f"GPU {i} free memory {free:.1f} GiB < {cfg.min_free_gpu_gib} GiB")
    return problems


def require_free_disk(path: str | os.PathLike, need_bytes: int, plan: str) -> int:
    """Refuse (`PreflightRefused`, exit 83) before anything is written when the filesystem of `path` has fewer free
    bytes than a stage will write; `plan` says how `need_bytes` was estimated. Returns the free bytes."""
    free = free_bytes(path)
    if free is not None and free < need_bytes:
        raise PreflightRefused(f"disk preflight: {plan} = {human_bytes(need_bytes)} to write under {path}, but its "
                               f"filesystem has {human_bytes(free)} free")
    return free if free is not None else -1


def preflight(cfg: PreflightConfig, run_dir: str | os.PathLike) -> HostStatus:
    """Check the host; raise `PreflightRefused` naming every failed check."""
    status = host_status(run_dir)
    problems = preflight_problems(cfg, status)
    if problems:
        raise PreflightRefused("host preflight refused: " + "; ".join(problems))
    return status


# ---------------------------------------------------------------------------------------------------- lock

def default_lock_path() -> Path:
    # NOTE: never /tmp by default: a tmp cleaner or a private /tmp per service would split one host into two locks.
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "align" / "heavy-job.lock"


def resolve_lock_path(cfg: LockConfig | None = None) -> Path:
    if cfg is not None and cfg.path:
        return Path(cfg.path).expanduser()
    if os.environ.get(LOCK_ENV):
        return Path(os.environ[LOCK_ENV]).expanduser()
    return default_lock_path()


class HeavyJobLock:
    """Exclusive non-blocking flock on the host's heavy-job lock file; a context manager.

    `acquire()` raises `PreflightRefused` at once when another process holds the lock, naming its pid and command.
    The descriptor can be handed to a child (`fileno()`, `pass_fds`) so the lock lives as long as the heavy job."""

    def __init__(self, path: str | os.PathLike, command: str | None = None):
        self.path = Path(path)
        self.command = command if command is not None else " ".join(sys.argv)
        self._fd: int | None = None

    def fileno(self) -> int:
        if self._fd is None:
            raise RuntimeError(f"{self.path}: lock not held")
        return self._fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> "HeavyJobLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise PreflightRefused(f"heavy-job lock {self.path} is held by pid {holder.get('pid', '?')} "
                                   f"({holder.get('command', 'unknown command')}); one heavy job per host") from None
        record = json.dumps({"pid": os.getpid(), "command": self.command, "since": time.time()}).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, record + b"\n", 0)
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        # Clear the holder record while still holding the lock, so a reader never sees our pid after we let go.
        os.ftruncate(self._fd, 0)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> "HeavyJobLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _read_holder(fd: int) -> dict:
    try:
        raw = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
        return json.loads(raw) if raw else {}
    except (OSError, ValueError):
        return {}


def lock_holder(path: str | os.PathLike) -> dict | None:
    """The holder record of a held lock, or None when nobody holds it (probes with a non-blocking flock)."""
    path = Path(path)
    if not path.exists():
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_holder(fd) or {"pid": None}
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
