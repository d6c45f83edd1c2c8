"""Where ingest's rows come from: a parquet or JSONL file, on disk or at an HTTP(S) URL (align.data.hub).

Every reader gives the same four things: `label` (the path or URL, named by every error), `names()` (the columns
present: a parquet schema's, or the keys of a JSONL file's first row), `type_of(column)` (the arrow type; None for
JSONL, whose values are typed row by row), `rows(columns, batch_rows)` (dicts of those columns, one per row, or a
`RowError` for a row that cannot be read: a JSONL line that is not a JSON object) and, after the rows were read,
`sha256()`: the content hash of the file's bytes, the same for a local file and the same file served over HTTP.

Parquet is read one row group batch at a time (over HTTP by range requests: footer, then the chosen columns of each
row group); JSONL one line at a time (over HTTP as one resumable stream whose bytes are hashed as they arrive)."""

from __future__ import annotations

import glob
import json
from itertools import chain
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from align.data.hub import HttpConfig, RemoteFile, iter_lines, stream
from align.data.schema import RowError
from align.exceptions import DataError
from align.utils.fsio import sha256_file

FILE_TYPES = ("parquet", "jsonl")


def file_type_of(name: str, declared: str) -> str:
    """`declared` unless "auto"; else from the name's suffix (.parquet, .jsonl / .ndjson / .json lines)."""
    if declared != "auto":
        return declared
    base = name.split("?", 1)[0].lower()
    if base.endswith(".parquet"):
        return "parquet"
    if base.endswith((".jsonl", ".ndjson")):
        return "jsonl"
    raise DataError(f"{name}: cannot tell the file type from its name; set file_type = \"parquet\" or \"jsonl\"")


class ParquetRows:
    def __init__(self, label: str, handle, local: Path | None, http: HttpConfig):
        self.label, self._local, self._http = label, local, http
        try:
            self.file = pq.ParquetFile(handle)
        except (pa.ArrowInvalid, pa.ArrowException, OSError) as exc:
            raise DataError(f"{label}: not a readable parquet file ({exc})") from None

    def names(self) -> list[str]:
        return self.file.schema_arrow.names

    def type_of(self, column: str) -> pa.DataType:
        return self.file.schema_arrow.field(column).type

    def rows(self, columns: list[str], batch_rows: int) -> Iterator[dict]:
        for group in range(self.file.num_row_groups):
            try:
                for batch in self.file.iter_batches(batch_size=batch_rows, row_groups=[group], columns=columns):
                    yield from batch.to_pylist()
            except (pa.ArrowException, OSError) as exc:
                raise DataError(f"{self.label}: row group {group} is unreadable (truncated or corrupt file?): "
                                f"{exc}") from None

    def sha256(self) -> str:
        if self._local is not None:
            return sha256_file(self._local)
        streamed = stream(self.label, self._http)  # one sequential pass: ranges read only what ingest needed
        for _ in streamed:
            pass
        return streamed.sha256


class JsonlRows:
    def __init__(self, label: str, lines: Iterator[bytes], digest):
        self.label, self._digest = label, digest
        self._lines = (line for line in lines if line.strip())
        first = next(self._lines, None)
        self._first = self._parse(first) if first is not None else None
        self._pending = [] if first is None else [first]

    def _parse(self, line: bytes) -> dict | RowError:
        try:
            value = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return RowError("<line>", f"is not valid JSON ({exc.__class__.__name__}: {exc})")
        if not isinstance(value, dict):
            return RowError("<line>", f"expected a JSON object, got {type(value).__name__}")
        return value

    def names(self) -> list[str]:
        return list(self._first) if isinstance(self._first, dict) else []

    def type_of(self, column: str) -> None:
        return None

    def rows(self, columns: list[str], batch_rows: int) -> Iterator[dict | RowError]:
        for line in chain(self._pending, self._lines):
            value = self._parse(line)
            yield value if isinstance(value, RowError) else {c: value.get(c) for c in columns}

    def sha256(self) -> str:
        return self._digest()


def _local_lines(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as f:
        for line in f:
            yield line.rstrip(b"\r\n")


def open_rows(path: str, url: str, file_type: str, http: HttpConfig, base_dir: Path) -> ParquetRows | JsonlRows:
    """The reader of one source: `path` (relative to base_dir) or `url`, exactly one of them non-empty."""
    kind = file_type_of(url or path, file_type)
    if url:
        if kind == "parquet":
            return ParquetRows(url, RemoteFile(url, http), None, http)
        streamed = stream(url, http)
        return JsonlRows(url, iter_lines(streamed), lambda: streamed.sha256)
    local = base_dir / path
    if not local.is_file():
        raise DataError(f"{local}: file not found")
    if kind == "parquet":
        return ParquetRows(str(local), local, local, http)
    return JsonlRows(str(local), _local_lines(local), lambda: sha256_file(local))  # the whole file, cut or not


GLOB_CHARS = ("*", "?", "[")


def source_files(path: str, url: str, urls: tuple[str, ...], base_dir: Path) -> list[tuple[str, str]]:
    """(path, url) of each file of a source, exactly one of path / url / urls given: a path with a glob character
    (*, ?, [) is every match under base_dir in sorted order (none: an error naming the pattern); `urls` are taken in
    their order (a dataset's parquet shards)."""
    if urls:
        return [("", u) for u in urls]
    if url or not any(c in path for c in GLOB_CHARS):
        return [(path, url)]
    found = sorted(Path(p) for p in glob.glob(str(base_dir / path)) if Path(p).is_file())
    matches = [str(p.relative_to(base_dir)) if p.is_relative_to(base_dir) else str(p) for p in found]
    if not matches:
        raise DataError(f"{base_dir / path}: no file matches the pattern")
    return [(m, "") for m in matches]

