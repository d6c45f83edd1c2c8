"""Artifact manifests: `manifest.json` lists every file of an artifact directory with its sha256 and size.

An artifact without its manifest does not exist: the manifest is written last, atomically, so a directory whose
writer died is never taken as complete."""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path

from align.exceptions import ArtifactError
from align.utils.fsio import atomic_write_json, sha256_bytes, sha256_file

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


def write_manifest(root: str | os.PathLike, kind: str, inputs: dict | None = None, extra: dict | None = None) -> dict:
    """Hash every file under `root` and write `root/manifest.json` last. Returns the manifest."""
    root = Path(root)
    manifest = {
        "kind": kind,
        "files": hash_files(root),
        "inputs": dict(sorted((inputs or {}).items())),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    for key, value in (extra or {}).items():
        if key in manifest:
            raise ValueError(f"manifest extra key {key!r} collides with a reserved key")
        manifest[key] = value
    atomic_write_json(root / MANIFEST, manifest)
    return manifest


def read_manifest(root: str | os.PathLike, kind: str | None = None, verify_hashes: bool = False) -> dict:
    """Read and check `root/manifest.json`: kind, presence and size of every file, and hashes when asked."""
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
    for rel, meta in manifest.get("files", {}).items():
        fpath = root / rel
        if not fpath.is_file():
            raise ArtifactError(f"{fpath}: listed in {path} but missing")
        size = fpath.stat().st_size
        if size != meta["bytes"]:
            raise ArtifactError(f"{fpath}: {size} bytes, manifest {path} says {meta['bytes']}")
        if verify_hashes and sha256_file(fpath) != meta["sha256"]:
            raise ArtifactError(f"{fpath}: sha256 differs from manifest {path}")
    return manifest


def manifest_digest(root: str | os.PathLike) -> str:
    """Content identity of an artifact: the sha256 of its manifest's file table (not of its timestamp)."""
    manifest = read_manifest(root)
    return sha256_bytes(json.dumps(manifest["files"], sort_keys=True).encode())
