"""Durable file publication: stage, fsync, rename, fsync the parent.

NOTE: a rename can reach the journal before the data it names; without the fsyncs a crash leaves zero-length files
under a name that looks finished. Every artifact in align is published through these helpers.

A write that fails for want of space (ENOSPC, EDQUOT) or on a read-only filesystem (EROFS) leaves nothing
half-written and becomes one `DiskFullError` (exit 84) naming the path, the bytes being written and the free space
(`disk_errors`): torch's "unexpected pos" or a safetensors IoError says none of that."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from align.exceptions import DiskFullError

_CHUNK = 1 << 20
DISK_ERRNOS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
               errno.EROFS: "read-only file system"}
# The same errors as other libraries word them (pyarrow's IOError text, safetensors' Rust io::Error).
_DISK_TEXTS = {"no space left on device": "no space left on device", "os error 28": "no space left on device",
               "disk quota exceeded": "disk quota exceeded", "os error 122": "disk quota exceeded",
               "read-only file system": "read-only file system", "os error 30": "read-only file system"}


def free_bytes(path: str | os.PathLike) -> int | None:
    """Free bytes on the filesystem that holds `path` (or its nearest existing parent); None when unknown."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return shutil.disk_usage(probe).free
    except OSError:
        return None


def human_bytes(n: int | None) -> str:
    if n is None:
        return "unknown"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit} ({n} bytes)"
    return f"{n} bytes"


def _disk_reason(exc: BaseException) -> str | None:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in DISK_ERRNOS:
            return DISK_ERRNOS[exc.errno]
        text = str(exc).lower()
        for marker, reason in _DISK_TEXTS.items():
            if marker in text:
                return reason
        exc = exc.__cause__ or exc.__context__
    return None


def disk_full_error(path: str | os.PathLike | None, nbytes: int | None, exc: BaseException) -> DiskFullError | None:
    """The `DiskFullError` that `exc`, raised while writing `nbytes` to `path`, stands for; None when it is another
    failure. Besides the errno (or its text, from pyarrow or safetensors), a write that failed without one (torch's
    zip writer: "unexpected pos") counts when the filesystem, once the partial write is removed, has fewer free
    bytes than the write needs: it could not have fit."""
    reason = _disk_reason(exc)
    free = free_bytes(path) if path is not None else None
    if reason is None:
        if not nbytes or free is None or free >= nbytes:
            return None
        reason = "no space left on device"
    while isinstance(exc, DiskFullError) and isinstance(exc.__cause__, Exception):
        exc = exc.__cause__  # nested: quote the original failure once
    said = str(exc).splitlines()[0] if str(exc) else ""
    if path is None:
        path = "(a file its writer did not name)"
    return DiskFullError(f"{path}: {reason} while writing {human_bytes(nbytes)}; free on its filesystem: "
                         f"{human_bytes(free)} ({type(exc).__name__}: {said})")


@contextmanager
def disk_errors(path: str | os.PathLike, nbytes: int | None) -> Iterator[None]:
    """Turn a failed write of `nbytes` to `path` for want of space into a `DiskFullError` (`disk_full_error`). Put it
    around the code that cleans the partial write up, so the free space is measured after the cleanup. Nested, the
    outermost names the whole write (a checkpoint, not the one file of it that found the disk full)."""
    try:
        yield
    except Exception as exc:
        err = disk_full_error(path, nbytes, exc)
        if err is None:
            raise
        raise err from exc


def tree_bytes(root: str | os.PathLike) -> int:
    return sum(p.stat().st_size for p in Path(root).rglob("*") if p.is_file())


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def fsync_dir(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` so that a reader sees either the old file or the complete new one."""
    path = Path(path)
    with disk_errors(path, len(data)):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            if tmp.exists():
                tmp.unlink()
        fsync_dir(path.parent)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def fsync_tree(root: str | os.PathLike) -> None:
    """fsync every file, then every directory bottom-up, so the tree is durable before it is renamed."""
    root = Path(root)
    for dirpath, _dirs, files in os.walk(root, topdown=False):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(dirpath)


def staging_dir(final: str | os.PathLike) -> Path:
    """A fresh staging directory beside `final` (same filesystem, so publication is a rename).

    Stale partials of earlier, dead writers are removed first (a live writer's partial is left alone): a `.partial-*`
    directory is never read as an artifact."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    for stale in final.parent.glob(f"{final.name}.partial-*"):
        if not _writer_alive(stale.name.rpartition("-")[2]):
            shutil.rmtree(stale, ignore_errors=True)
    staging = final.parent / f"{final.name}.partial-{os.getpid()}"
    staging.mkdir()
    return staging


def _writer_alive(pid_text: str) -> bool:
    """Whether the process that owns a `.partial-<pid>` directory still runs (and is not this process, whose own
    leftover from an earlier call is stale by definition)."""
    if not pid_text.isdigit() or int(pid_text) == os.getpid():
        return False
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by another user
    return True


def publish_dir(staging: str | os.PathLike, final: str | os.PathLike) -> Path:
    """Make `staging` durable and move it to `final`, replacing an older `final` only after the new one is durable."""
    staging, final = Path(staging), Path(final)
    with disk_errors(final, None):  # delayed allocation can report ENOSPC at fsync; the caller removes staging
        fsync_tree(staging)
    old = None
    if final.exists():
        old = final.parent / f"{final.name}.old-{os.getpid()}"
        os.replace(final, old)
    os.replace(staging, final)
    fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return final
