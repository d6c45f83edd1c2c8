"""Artifact manifests: `manifest.json` lists every file of an artifact directory with its sha256 and size.

An artifact without its manifest does not exist: the manifest is written last, atomically, so a directory whose
writer died is never taken as complete. A consumer verifies the files against it before use (`verify_artifact`):
a file changed after publication (a flipped bit) is one `ArtifactError` naming the file and both sha256s; the stat
cache (align.utils.stat_cache) keeps an unchanged artifact from being rehashed. `numerics` records what the bits
depend on besides the inputs (align.utils.numerics)."""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

from align.exceptions import ArtifactError
from align.utils.fsio import atomic_write_json, sha256_bytes, sha256_file
from align.utils.numerics import fingerprint
from align.utils.stat_cache import StatCache

MANIFEST = "manifest.json"


def _iter_files(root: Path):
    for dirpath, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if rel != MANIFEST and not name.startswith(".") :
                yield rel, path


def hash_files(root: str | os.PathLike) -> dict[str, dict]:
    root = Path(root)
    return {rel: {"sha256": sha256_file(p), "bytes": p.stat().st_size} for rel, p in _iter_files(root)}


RESERVED_KEYS = ("kind", "files", "inputs", "created", "numerics")  # what write_manifest writes itself; never extras


def write_manifest(root: str | os.PathLike, kind: str, inputs: dict | None = None, extra: dict | None = None) -> dict:
    """Hash every file under `root` and write `root/manifest.json` last. Returns the manifest."""
    root = Path(root)
    manifest = {
        "kind": kind,
        "files": hash_files(root),
        "inputs": dict(sorted((inputs or {}).items())),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "numerics": fingerprint(),  # what the bits depend on besides the inputs (align.utils.numerics)
    }
    for key, value in (extra or {}).items():
        if key in manifest:
            raise ValueError(f"manifest extra key {key!r} collides with a reserved key")
        manifest[key] = value
    atomic_write_json(root / MANIFEST, manifest)
    return manifest


def _repair_hint(profile: str | None = None) -> str:
    profile = profile or os.environ.get("ALIGN_PROFILE") or "<profile>"
    return (f"nothing was built on it; rebuild its producer with `python -m pipeline.verify --profile {profile} "
            f"--repair` then `doit profile={profile}` (docs/RELIABILITY.md)")


def file_problems(root: str | os.PathLike, manifest: dict, *, verify_hashes: bool = True,
                  cache_dir: str | os.PathLike | None = None, use_cache: bool = True,
                  profile: str | None = None) -> Iterator[str]:
    """One line per file of `manifest` that is missing, of another size, or (with `verify_hashes`) of another sha256
    than the manifest records, lazily (a caller that stops at the first line hashes no further). Hashes come from
    the stat cache when a file's stat is unchanged since it was last verified (align.utils.stat_cache)."""
    root = Path(root)
    path = root / MANIFEST
    cache = StatCache(root, cache_dir, enabled=use_cache) if verify_hashes else None
    files = manifest.get("files", {})
    try:
        for rel, meta in files.items():
            fpath = root / rel
            try:
                st = fpath.stat()
            except FileNotFoundError:
                yield f"{fpath}: listed in {path} but missing"
                continue
            if st.st_size != meta["bytes"]:
                yield f"{fpath}: {st.st_size} bytes, manifest {path} says {meta['bytes']}"
                continue
            if cache is None:
                continue
            actual, _cached = cache.sha256(rel, fpath, st)
            if actual != meta["sha256"]:
                cache.forget(rel)
                yield (f"{fpath}: sha256 differs from {path}: the file has {actual}, the manifest records "
                       f"{meta['sha256']}; it changed after the artifact was published; {_repair_hint(profile)}")
    finally:
        if cache is not None:
            cache.retain(files)  # a republished artifact's old files leave the cache
            cache.save()


def read_manifest(root: str | os.PathLike, kind: str | None = None, verify_hashes: bool = False,
                  cache_dir: str | os.PathLike | None = None, profile: str | None = None) -> dict:
    """Read and check `root/manifest.json`: kind, presence and size of every file, and sha256s when asked (through
    the stat cache: an unchanged file is not rehashed). Any difference is an `ArtifactError` naming the file."""
    root = Path(root)
    path = root / MANIFEST
    if not path.is_file():
        raise ArtifactError(f"{root}: no {MANIFEST}; the artifact is missing or was never completed")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"{path}: unreadable manifest ({exc})") from exc
    if kind is not None and manifest.get("kind") != kind:
        raise ArtifactError(f"{path}: kind is {manifest.get('kind')!r}, expected {kind!r}")
    problem = next(file_problems(root, manifest, verify_hashes=verify_hashes, cache_dir=cache_dir, profile=profile),
                   None)
    if problem is not None:
        raise ArtifactError(problem)
    return manifest


def verify_artifact(root: str | os.PathLike, kind: str | None = None, cache_dir: str | os.PathLike | None = None,
                    profile: str | None = None) -> dict:
    """`read_manifest` with every sha256 checked: what a consumer calls before it reads an artifact."""
    return read_manifest(root, kind=kind, verify_hashes=True, cache_dir=cache_dir, profile=profile)


def manifest_digest(root: str | os.PathLike) -> str:
    """Content identity of an artifact: the sha256 of its manifest's file table (not of its timestamp)."""
    manifest = read_manifest(root)
    return sha256_bytes(json.dumps(manifest["files"], sort_keys=True).encode())
