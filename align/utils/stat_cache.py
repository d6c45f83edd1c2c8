"""Stat cache for artifact verification: (size, mtime_ns, ctime_ns, inode, device) of a file -> the sha256 it had
when it was last hashed, so verifying an unchanged artifact costs one stat per file and a changed one is rehashed.

The DVC idea (its state database keys hashes by mtime, size and inode), with two additions:
- ctime joins the key: `touch -d` can put an old mtime back on an edited file, nothing but the kernel sets ctime.
- "Racy" entries are never trusted (git's racy-clean rule): a file whose mtime or ctime is within `RACY_NS` of the
  moment it was hashed may be written again in the same timestamp tick, so its stat would not change; such a file is
  hashed again next time, until its timestamps are old enough.

One small JSON file per artifact directory, in a cache folder (never inside the artifact: its listing stays what the
producer published): `$ALIGN_STAT_CACHE` (`off` disables it), else `$ALIGN_RUNS_DIR/.stat_cache` (every stage
worker has it; the launcher uses the same folder), else none (a library call outside the pipeline hashes every
time, and leaves no state behind). The cache is advisory: written atomically, a lost or unreadable one only costs a
rehash, and a cache that cannot be written (read-only folder) is skipped."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from align.utils.fsio import atomic_write_json, sha256_bytes, sha256_file

CACHE_ENV = "ALIGN_STAT_CACHE"
RACY_NS = 2_000_000_000  # coarser than any timestamp tick of a local filesystem (ext4/xfs/tmpfs: <= 10 ms)
_FORMAT = 1


def default_cache_dir() -> Path | None:
    """Where the cache lives for this process (module docstring); None when it is turned off."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return None if explicit == "off" else Path(explicit)
    runs = os.environ.get("ALIGN_RUNS_DIR")
    return Path(runs) / ".stat_cache" if runs else None


def _key(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


class StatCache:
    """The cached hashes of one artifact directory's files (relative path -> stat key + sha256)."""

    def __init__(self, artifact: str | os.PathLike, directory: str | os.PathLike | None = None, *,
                 enabled: bool = True):
        self.artifact = Path(artifact).resolve()
        folder = Path(directory) if directory is not None else default_cache_dir()
        self.path = None if folder is None or not enabled else \
            folder / (sha256_bytes(str(self.artifact).encode())[:32] + ".json")
        self._entries = self._load()
        self._dirty = False

    def _load(self) -> dict:
        if self.path is None or not self.path.is_file():
            return {}
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}  # a torn or foreign file: rehash, never trust it
        if not isinstance(data, dict) or data.get("format") != _FORMAT or data.get("artifact") != str(self.artifact):
            return {}
        entries = data.get("files")
        return entries if isinstance(entries, dict) else {}

    def lookup(self, rel: str, st: os.stat_result) -> str | None:
        """The sha256 last verified for `rel` when its stat is unchanged since, else None."""
        entry = self._entries.get(rel)
        if isinstance(entry, dict) and entry.get("stat") == _key(st):
            sha = entry.get("sha256")
            return sha if isinstance(sha, str) else None
        return None

    def record(self, rel: str, st: os.stat_result, sha256: str, hashed_at_ns: int) -> None:
        """Remember `sha256` for `rel` (stat taken before hashing), unless the file is racy (module docstring)."""
        if hashed_at_ns - max(st.st_mtime_ns, st.st_ctime_ns) < RACY_NS:
            self._entries.pop(rel, None)
            self._dirty = True
            return
        self._entries[rel] = {"stat": _key(st), "sha256": sha256}
        self._dirty = True

    def forget(self, rel: str) -> None:
        if self._entries.pop(rel, None) is not None:
            self._dirty = True

    def retain(self, rels) -> None:
        """Drop the entries of files not in `rels`."""
        for stale in [rel for rel in self._entries if rel not in rels]:
            self.forget(stale)

    def save(self) -> None:
        if self.path is None or not self._dirty:
            return
        try:
            atomic_write_json(self.path, {"format": _FORMAT, "artifact": str(self.artifact),
                                          "files": self._entries})
        except OSError:
            pass  # advisory (module docstring): a full or read-only cache folder costs a rehash, nothing else
        self._dirty = False

    def sha256(self, rel: str, path: Path, st: os.stat_result | None = None) -> tuple[str, bool]:
        """(sha256 of `path`, whether it came from the cache). A file hashed here is recorded."""
        st = st if st is not None else path.stat()
        cached = self.lookup(rel, st)
        if cached is not None:
            return cached, True
        now = time.time_ns()
        digest = sha256_file(path)
        after = path.stat()
        if _key(after) == _key(st):  # unchanged while it was read: the hash describes this stat
            self.record(rel, st, digest, now)
        return digest, False
