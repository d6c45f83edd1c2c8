"""Parquet or JSONL in, validated and de-duplicated records out: the `ingest:<source>` stage's library half.

A source is a local file (`path`) or an HTTP(S) URL (`url`, align.data.hub: resumable, range requests for parquet),
or several files read one after the other: a glob `path` (sorted matches) or `urls` (a dataset's parquet shards);
each file's content sha256 is then its own `inputs` entry and row numbers run on across the files.
The input is streamed (parquet one batch of a row group at a time, JSONL one line at a time, align.data.readers),
so a file larger than memory works; only the set of content hashes (32 bytes a row) is held. Output:
`records.parquet` in the normalised layout of the source's kind (`schema.NORMALISED`) and `manifest.json` (kind
"records") with row counts, the rejected rows and their reasons, and the input's content sha256 (under its path or
URL; `sha256 = ...` in the source pins it: a different file fails the source). Everything is written into a staging
directory and published by rename: a failure leaves no output that looks finished.

Bad input: a missing, non-parquet or truncated file, an HTTP error (named with its URL and status), a missing or
mistyped column, and an empty dataset each raise `DataError` naming the file (and the column). A row that violates
the schema is a counted rejection naming its row and column; more than `max_reject_fraction` of the rows rejected
fails the source."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Literal, Protocol

import pyarrow as pa
import pyarrow.parquet as pq

from align.data.hub import HttpConfig, is_url
from align.data.readers import GLOB_CHARS, JsonlRows, ParquetRows, open_rows, source_files
from align.data.outcome_agreement import outcome_agreement
from align.data.schema import from_row, has_tools, layout, RowError, content_hash, to_row, validate
from align.data.sources import FORMATS, make_records, type_name, type_ok
from align.exceptions import DataError
from align.utils.fsio import publish_dir, staging_dir
from align.utils.manifest import write_manifest
from align.verify.config import VerifyConfig

RECORDS = "records.parquet"
MANIFEST_KIND = "records"
MAX_LISTED_REJECTIONS = 1000
WRITE_OPTIONS = dict(compression="zstd", compression_level=3, use_dictionary=True, write_statistics=False,
                     version="2.6", data_page_version="1.0")


@dataclass(frozen=True)
class SourceConfig:
    """One source file and how its columns map to a record kind (see align.data.sources for the formats)."""

    kind: Literal["sft", "pairs", "prompts", "steps"]
    format: Literal["messages", "prompt_response", "gsm8k", "math", "argilla", "argilla_responses", "pair_columns",
                    "prompt_answer", "messages_answer", "prm800k"]
    path: str = ""  # a local file, relative to the project root, or a glob of files; exactly one of path, url, urls
    url: str = ""  # an http(s) URL (e.g. a hub's .../resolve/main/data/train.parquet)
    urls: tuple[str, ...] = ()  # several URLs read in order (a dataset's parquet shards)
    file_type: Literal["auto", "parquet", "jsonl"] = "auto"  # auto: from the name's suffix
    sha256: str = ""  # the input's expected content hash; "" : not pinned (the manifest records it either way)
    http: HttpConfig = field(default_factory=HttpConfig)  # how a url is fetched
    verify: VerifyConfig = field(default_factory=VerifyConfig)  # kind "steps": the verifier the labels are held to
    columns: dict[str, str] = field(default_factory=dict)  # logical name -> column name in the file
    id_column: str | None = None  # None: ids are `<source>-<row>`
    group_column: str | None = None  # a stratum (difficulty level, subject); any type, stored as text
    max_reject_fraction: float = 0.01
    batch_rows: int = 2048  # rows read per batch and written per row group (a shard build's unit of work)
    max_rows: int | None = None  # read only the first max_rows rows (a smoke profile's cut)

    def __post_init__(self):
        if sum(map(bool, (self.path, self.url, self.urls))) != 1:
            raise ValueError("a source needs exactly one of path (a local file or glob), url and urls (http or https)")
        for url in (self.url, *self.urls):
            if url and not is_url(url):
                raise ValueError(f"url must start with http:// or https://, got {url!r}")
        if self.sha256 and (self.urls or any(c in self.path for c in GLOB_CHARS)):
            raise ValueError("sha256 pins one file; a source of several files records each file's sha256 in the "
                             "manifest (inputs)")
        if self.kind not in FORMATS[self.format].kinds:
            raise ValueError(f"format {self.format!r} makes {' or '.join(FORMATS[self.format].kinds)} records, "
                             f"not {self.kind!r}")
        unknown = sorted(set(self.columns) - set(FORMATS[self.format].all_columns()))
        if unknown:
            raise ValueError(f"columns: {unknown[0]!r} is not a column of format {self.format!r}; "
                             f"its columns: {', '.join(FORMATS[self.format].all_columns())}")
        if self.batch_rows < 1 or (self.max_rows is not None and self.max_rows < 1):
            raise ValueError("batch_rows and max_rows must be >= 1")
        if not 0.0 <= self.max_reject_fraction <= 1.0:
            raise ValueError(f"max_reject_fraction must be in [0, 1], got {self.max_reject_fraction}")

    @property
    def location(self) -> str:
        """The path (or glob) or URL(s) as configured: a single file's manifest `inputs` key."""
        return self.url or self.path or " ".join(self.urls)


@dataclass
class IngestStats:
    rows_in: int = 0
    rows_out: int = 0  # records written (a PRM800K pairs row can make several, or none)
    rows_empty: int = 0  # valid rows that made no record (a PRM800K row without a rated alternative)
    duplicates: int = 0
    rejected: int = 0
    rejections: list[dict] = field(default_factory=list)

    def reject(self, row: int, column: str, reason: str) -> None:
        self.rejected += 1
        if len(self.rejections) < MAX_LISTED_REJECTIONS:
            self.rejections.append({"row": row, "column": column, "reason": reason})


def column_plan(src: SourceConfig, reader: ParquetRows | JsonlRows) -> dict[str, str]:
    """Map logical names (plus `_id`, `_group`) to file columns, checking presence and (parquet) type. A JSONL
    file's columns are its first row's keys, its optional columns read from every row (a row without the key
    has it null: a first row without `tools` must not drop later rows' tools); its values are typed row by row
    (align.data.sources)."""
    plan = {logical: src.columns.get(logical, logical) for logical in FORMATS[src.format].columns}
    names = reader.names()
    for logical in FORMATS[src.format].optional:  # used when present (a JSONL file: any row may hold it)
        if src.columns.get(logical, logical) in names or isinstance(reader, JsonlRows):
            plan[logical] = src.columns.get(logical, logical)
    for logical, column in plan.items():
        if column not in names and logical in FORMATS[src.format].optional:
            continue  # a JSONL file's optional column its first row lacks
        if column not in names:
            raise DataError(f"{reader.label}: missing column {column!r} (format {src.format!r} needs it as "
                            f"{logical!r}); columns present: {', '.join(names) or '(none: no readable first row)'}")
        expected = FORMATS[src.format].all_columns()[logical]
        actual = reader.type_of(column)
        if actual is not None and not type_ok(actual, expected):
            raise DataError(f"{reader.label}: column {column!r} has type {actual}, expected {type_name(expected)}")
    for key, column in (("_id", src.id_column), ("_group", src.group_column)):
        if column is not None:
            if column not in names:
                raise DataError(f"{reader.label}: missing column {column!r} (configured as {key[1:]}_column)")
            plan[key] = column
    return plan


def iter_rows(reader: ParquetRows | JsonlRows, plan: dict[str, str], batch_rows: int) -> Iterator[dict | RowError]:
    """Rows as dicts keyed by logical name (or a `RowError` for an unreadable row), streamed."""
    columns = sorted(set(plan.values()))
    for row in reader.rows(columns, batch_rows):
        yield row if isinstance(row, RowError) else {logical: row[column] for logical, column in plan.items()}


def _reject_ceiling(stats: IngestStats, src: SourceConfig, label: str) -> None:
    if stats.rows_in == 0:
        raise DataError(f"{label}: the dataset is empty (0 rows)")
    if stats.rejected / stats.rows_in > src.max_reject_fraction:
        first = "; ".join(f"row {r['row']}, column {r['column']!r}: {r['reason']}" for r in stats.rejections[:3])
        raise DataError(f"{label}: {stats.rejected} of {stats.rows_in} rows rejected, more than the allowed "
                        f"{src.max_reject_fraction:.1%} (max_reject_fraction); first: {first}")
    if stats.rows_out == 0:
        raise DataError(f"{label}: no valid rows")


def _column_of(plan: dict[str, str], field_path: str) -> str:
    """`messages[1].role` -> `<file column>[1].role`: the rejection names the column as the file spells it."""
    base = field_path.split("[")[0].split(".")[0]
    return plan.get(base, base) + field_path[len(base):]


class Screen(Protocol):
    """A check every record passes before it is written (align.data.decontam: the evaluation sets' n-grams)."""

    def keep(self, row: int, record) -> bool: ...  # False: leave the record out (counted by the screen)

    def report(self) -> dict: ...  # the manifest's `decontam`


def _chained(files: list[tuple[str, ParquetRows | JsonlRows, dict[str, str]]], batch_rows: int,
             reached: list[int]) -> Iterator[dict | RowError]:
    """The rows of every file in order; `reached` collects the files whose rows were started."""
    for i, (_, reader, plan) in enumerate(files):
        reached.append(i)
        yield from iter_rows(reader, plan, batch_rows)


class _RecordsWriter:
    """records.parquet in its kind's layout, switched to the tool layout (schema.NORMALISED_TOOLS) at the first
    record with a tool field, the row groups written so far rewritten in it: a source without tools writes exactly
    the layout it wrote before tools existed (same bytes)."""

    def __init__(self, target: Path, kind: str):
        self.target, self.kind, self.tools = target, kind, False
        self.writer = pq.ParquetWriter(str(target), layout(kind, False), **WRITE_OPTIONS)

    def write(self, records: list) -> None:
        if not self.tools and any(has_tools(r) for r in records):
            self._to_tool_layout()
        rows = [to_row(r, self.tools) for r in records]
        self.writer.write_table(pa.Table.from_pylist(rows, schema=layout(self.kind, self.tools)))

    def _to_tool_layout(self) -> None:
        self.writer.close()
        plain = self.target.with_name(self.target.name + ".plain")
        self.target.rename(plain)
        self.tools = True
        self.writer = pq.ParquetWriter(str(self.target), layout(self.kind, True), **WRITE_OPTIONS)
        written = pq.ParquetFile(plain)
        for group in range(written.num_row_groups):
            self.write([from_row(self.kind, row) for row in written.read_row_group(group).to_pylist()])
        plain.unlink()

    def close(self) -> None:
        self.writer.close()


def _write_records(name: str, src: SourceConfig, files: list[tuple[str, ParquetRows | JsonlRows, dict[str, str]]],
                   target: Path, screen: Screen | None = None) -> tuple[IngestStats, list[int]]:
    stats, seen, buffer, reached = IngestStats(), set(), [], []
    plan = files[0][2]  # for naming columns in rejections (every file maps the same logical names)
    writer = _RecordsWriter(target, src.kind)
    try:
        for index, row in enumerate(_chained(files, src.batch_rows, reached)):
            if src.max_rows is not None and index >= src.max_rows:
                break
            stats.rows_in += 1
            try:
                if isinstance(row, RowError):
                    raise row
                rid = str(row["_id"]) if row.get("_id") is not None else f"{name}-{index}"
                group = "" if row.get("_group") is None else str(row["_group"])
                records = [validate(r) for r in make_records(src.format, src.kind, row, rid, group)]
            except RowError as exc:
                stats.reject(index, _column_of(plan, exc.field), exc.reason)
                continue
            stats.rows_empty += not records
            for record in records:
                digest = content_hash(record)
                if digest in seen:  # exact duplicate of what a model would see: keep the first
                    stats.duplicates += 1
                    continue
                seen.add(digest)
                if screen is not None and not screen.keep(index, record):
                    continue
                buffer.append(record)
                stats.rows_out += 1
            if len(buffer) >= src.batch_rows:
                writer.write(buffer)
                buffer.clear()
        if buffer:
            writer.write(buffer)
    finally:
        writer.close()
    return stats, reached


def _input_hash(src: SourceConfig, reader: ParquetRows | JsonlRows, stats: IngestStats, last: bool = True) -> str:
    """The input's content sha256, checked against a pinned `sha256`. A `max_rows` cut of a JSONL stream stopped
    early (a local file is hashed whole), so its hash covers only what was read: it is recorded as such, and
    cannot match a pin. `last`: the file the rows stopped in (of several, only it can have been cut)."""
    digest = reader.sha256()
    cut = last and src.max_rows is not None and stats.rows_in >= src.max_rows
    if cut and is_url(reader.label) and isinstance(reader, JsonlRows):
        digest = f"partial:{digest}"
    if src.sha256 and digest != src.sha256:
        raise DataError(f"{reader.label}: content sha256 is {digest}, the source pins {src.sha256} "
                        "(sha256 = ...): a different file")
    return digest


def iter_records(path: Path, kind: str) -> Iterator:
    """The records of a `records.parquet`, one row group at a time."""
    pf = pq.ParquetFile(path)
    for group in range(pf.num_row_groups):
        yield from (from_row(kind, row) for row in pf.read_row_group(group).to_pylist())


def _agreement(src: SourceConfig, records: Path) -> dict:
    """Step-labelled records carry the dataset's own final-answer verdicts: how often the verifier agrees."""
    if src.kind != "steps":
        return {}
    return {"outcome_agreement": outcome_agreement(iter_records(records, "steps"), src.verify)}


def ingest_source(name: str, src: SourceConfig, out_dir: str | Path, base_dir: str | Path = ".",
                  screen: Screen | None = None) -> dict:
    """Ingest one source into `out_dir` (published atomically). Returns the manifest; with a `screen` (the
    stage's decontamination) its report is the manifest's `decontam`."""
    files = []  # (manifest inputs key, reader, column plan) per file; one unless path is a glob or urls are given
    for path, url in source_files(src.path, src.url, src.urls, Path(base_dir)):
        reader = open_rows(path, url, src.file_type, src.http, Path(base_dir))
        files.append((url or path, reader, column_plan(src, reader)))
    staging = staging_dir(out_dir)
    try:
        stats, reached = _write_records(name, src, files, staging / RECORDS, screen)
        _reject_ceiling(stats, src, files[0][1].label if len(files) == 1 else src.location)
        if len(files) == 1:
            inputs = {src.location: _input_hash(src, files[0][1], stats)}
        else:  # a max_rows cut may stop before the last files: they were never read, so have no hash
            inputs = {key: _input_hash(src, reader, stats, i == reached[-1]) if i in reached else "unread (max_rows)"
                      for i, (key, reader, _) in enumerate(files)}
        manifest = write_manifest(staging, MANIFEST_KIND, inputs=inputs, extra={
            "source": name, "record_kind": src.kind, "format": src.format, "rows_in": stats.rows_in,
            "rows_out": stats.rows_out, "rows_empty": stats.rows_empty, "duplicates": stats.duplicates,
            "rejected": stats.rejected, "rejections": stats.rejections, **_agreement(src, staging / RECORDS),
            **({} if screen is None else {"decontam": screen.report()})})
        publish_dir(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)  # nothing half-written survives a failure
        raise
    return manifest
