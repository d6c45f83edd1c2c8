"""Durable file publication: stage, fsync, rename, fsync the parent.

NOTE: a rename can reach the journal before the data it names; without the fsyncs a crash leaves zero-length files
under a name that looks finished. Every artifact in align is published through these helpers."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

_CHUNK = 1 << 20


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
