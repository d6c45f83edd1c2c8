"""Build a token shard set from an ingest artifact: the `shards:<split>` stage's library half.

Work is split by the records file's row groups (`row_groups_per_shard` of them make one shard) and tokenised by a
process pool (forked from a torch-free parent, which the stage worker is; spawned otherwise). Each shard is written into a build
directory beside the target and marked done (`.shard-NNNNN.done`) only after its files are complete; a rerun after
a crash reuses the done shards of the same build identity (same records, tokenizer and encoding config) and
tokenises only the rest. The manifest is written last and the directory is published by rename.

Shard order and contents depend only on the inputs, never on the number of workers.

A mixture split (`build_mixture_shards`) is one shard set built from several ingest artifacts, source after source
in name order (each source's rows one contiguous range, no shard mixing two sources); its manifest adds `mixture`
(per source: rows, weight, target and realised share of an epoch; align.data.mixture), which the loader draws each
epoch by. A single-source build writes exactly what it wrote before mixtures existed."""

from __future__ import annotations

import json
import shutil
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path

import pyarrow.parquet as pq

from align.config import config_digest, to_dict
from align.data.encoding import SEQS_PER_ROW, EncodingConfig, encode_record, token_dtype
from align.data.ingest_parquet import MANIFEST_KIND as RECORDS_KIND
from align.data.ingest_parquet import RECORDS
from align.data.mixture import MixtureConfig, describe
from align.data.schema import from_row
from align.data.store import FORMAT_VERSION, KIND, ShardStats, shard_name, write_shard
from align.exceptions import ArtifactError
from align.tokenizer import Tokenizer, TokenizerConfig
from align.utils.fsio import atomic_write_json, publish_dir
from align.utils.manifest import manifest_digest, read_manifest, write_manifest

BUILD_SUFFIX = ".building"
IDENTITY = ".build.json"


@dataclass(frozen=True)
class ShardBuildConfig:
    encoding: EncodingConfig = field(default_factory=EncodingConfig)
    workers: int = 2  # processes; 1 builds in this process
    row_groups_per_shard: int = 1

    def __post_init__(self):
        if self.workers < 1 or self.row_groups_per_shard < 1:
            raise ValueError("workers and row_groups_per_shard must be >= 1")


@dataclass(frozen=True)
class _Job:
    index: int
    records: str
    row_groups: tuple[int, ...]
    kind: str
    build_dir: str
    encoding: EncodingConfig
    tokenizer: TokenizerConfig


_TOKENIZERS: dict[TokenizerConfig, Tokenizer] = {}


def _tokenizer(cfg: TokenizerConfig) -> Tokenizer:
    # One tokenizer per worker process, reused across its jobs (loading parses a 2 MB JSON; its word cache warms).
    if cfg not in _TOKENIZERS:
        _TOKENIZERS[cfg] = Tokenizer.from_config(cfg)
    return _TOKENIZERS[cfg]


def build_one(job: _Job) -> ShardStats:
    """Tokenise one shard's row groups and write its files, then its done marker (last)."""
    tok = _tokenizer(job.tokenizer)
    table = pq.ParquetFile(job.records).read_row_groups(list(job.row_groups))
    encoded, metas, dropped = [], [], 0
    for row in table.to_pylist():
        record = from_row(job.kind, row)
        enc = encode_record(tok, record, job.encoding)
        if enc is None:
            dropped += 1
            continue
        encoded.append(enc)
        metas.append({"id": row["id"], "group": row["group"], "content_hash": row["content_hash"],
                      "gold": row.get("gold")})
    build_dir = Path(job.build_dir)
    name = shard_name(job.index)
    stats = write_shard(build_dir, name, encoded, metas, token_dtype(tok.vocab_size), dropped)
    atomic_write_json(build_dir / f".{name}.done", asdict(stats))
    return stats


def _prepare_build_dir(build_dir: Path, identity: dict) -> dict[int, ShardStats]:
    """Reuse a crashed build of the same identity (its done shards); otherwise start empty."""
    marker = build_dir / IDENTITY
    if build_dir.is_dir() and marker.is_file() and json.loads(marker.read_text()) == identity:
        done = {}
        for path in build_dir.glob(".shard-*.done"):
            done[int(path.name[len(".shard-"):-len(".done")])] = ShardStats(**json.loads(path.read_text()))
        return done
    shutil.rmtree(build_dir, ignore_errors=True)
    build_dir.mkdir(parents=True)
    atomic_write_json(marker, identity)
    return {}


def _pool_context():
    """fork when this process has not imported torch: the children inherit the loaded tokenizer (no re-import, no
    re-parse). NOTE: a process that imported torch may hold OpenMP threads, and forking it can deadlock: spawn."""
    return get_context("spawn" if "torch" in sys.modules else "fork")


def _run_jobs(jobs: list[_Job], workers: int) -> dict[int, ShardStats]:
    if workers == 1 or len(jobs) <= 1:
        return {job.index: build_one(job) for job in jobs}
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=_pool_context()) as pool:
        return dict(zip((job.index for job in jobs), pool.map(build_one, jobs)))


def _read_records(records_dir: Path) -> tuple[dict, Path, int]:
    """(ingest manifest, records file, row groups) of one ingest artifact; refuses kinds without a chat layout."""
    ingest = read_manifest(records_dir, kind=RECORDS_KIND, verify_hashes=True)
    kind = ingest["record_kind"]
    if kind not in SEQS_PER_ROW:  # "steps": PRM800K's step labels are a reward model's data, not chat shards
        raise ArtifactError(f"{records_dir}: records of kind {kind!r} have no chat-shard layout (shards build "
                            f"{', '.join(SEQS_PER_ROW)}); a step-labelled set is read as records "
                            "(align.data.ingest_parquet.iter_records)")
    records = records_dir / RECORDS
    return ingest, records, pq.ParquetFile(records).num_row_groups


def _build(parts: list[tuple[str, Path]], out_dir: Path, tokenizer: TokenizerConfig, cfg: ShardBuildConfig,
           mixture: MixtureConfig | None) -> dict:
    """Shards of every part's records, part after part (a part's rows are one contiguous range of the set)."""
    read = [_read_records(records_dir) for _, records_dir in parts]
    kinds = {ingest["record_kind"] for ingest, _, _ in read}
    if len(kinds) > 1:
        named = ", ".join(f"{name}: {ingest['record_kind']}" for (name, _), (ingest, _, _) in zip(parts, read))
        raise ArtifactError(f"a mixture's sources must hold one record kind; they hold {named}")
    kind = kinds.pop()
    tok = _tokenizer(tokenizer)
    per = cfg.row_groups_per_shard
    digests = {name: manifest_digest(records_dir) for name, records_dir in parts}
    identity = {"records": digests[parts[0][0]] if mixture is None else digests, "tokenizer": tok.content_hash,
                "encoding": config_digest(cfg.encoding), "row_groups_per_shard": per, "format": FORMAT_VERSION}
    if mixture is not None:
        identity["mixture"] = to_dict(mixture)
    build_dir = out_dir.with_name(out_dir.name + BUILD_SUFFIX)
    done = _prepare_build_dir(build_dir, identity)
    units, part_of = [], []  # (records file, row groups) of each shard, and the part it belongs to
    for p, (_, records, n_groups) in enumerate(read):
        for i in range(0, n_groups, per):
            units.append((records, tuple(range(i, min(i + per, n_groups)))))
            part_of.append(p)
    jobs = [_Job(i, str(records), g, kind, str(build_dir), cfg.encoding, tokenizer)
            for i, (records, g) in enumerate(units) if i not in done]
    stats = {**done, **_run_jobs(jobs, cfg.workers)}
    for path in [build_dir / IDENTITY, *build_dir.glob(".shard-*.done")]:
        path.unlink()  # build bookkeeping is not part of the artifact
    ordered = [stats[i] for i in range(len(units))]
    totals = {key: sum(getattr(s, key) for s in ordered) for key in ShardStats.__dataclass_fields__}
    if mixture is None:
        inputs, source, extra = {"records": identity["records"]}, read[0][0].get("source"), {}
    else:
        inputs = {f"records:{name}": digest for name, digest in digests.items()}
        source = None
        extra = {"mixture": _mixture_entry(parts, part_of, ordered, mixture)}
    manifest = write_manifest(build_dir, KIND, inputs={**inputs, "tokenizer.json": tok.content_hash}, extra={
        "format_version": FORMAT_VERSION, "record_kind": kind, "seqs_per_row": SEQS_PER_ROW[kind],
        "token_dtype": token_dtype(tok.vocab_size).name, "encoding": to_dict(cfg.encoding),
        "tokenizer": {"content_hash": tok.content_hash, "vocab_size": tok.vocab_size, "bos_id": tok.bos_id,
                      "eos_id": tok.eos_id},
        "source": source, "shards": [{"name": shard_name(i), "rows": s.rows, "tokens": s.tokens}
                                     for i, s in enumerate(ordered)],
        "reused_shards": len(done), **totals, **extra})
    publish_dir(build_dir, out_dir)
    return manifest


def _mixture_entry(parts: list[tuple[str, Path]], part_of: list[int], ordered: list[ShardStats],
                   mixture: MixtureConfig) -> dict:
    """The manifest's `mixture`: rows per source after encoding, target and realised shares of an epoch. A source
    whose weight asks for more than `max_repetition` passes fails the build, before any training reads it."""
    rows = [sum(s.rows for s, p in zip(ordered, part_of) if p == index) for index in range(len(parts))]
    names = tuple(name for name, _ in parts)
    empty = [name for name, r in zip(names, rows) if r == 0]
    if empty:
        raise ArtifactError(f"mixture source {empty[0]!r}: no rows left after encoding (every row dropped?)")
    epoch_rows = mixture.epoch_rows or sum(rows)
    return describe(names, tuple(float(mixture.sources[n]) for n in names), rows, mixture.max_repetition, epoch_rows)


def build_shards(records_dir: str | Path, out_dir: str | Path, tokenizer: TokenizerConfig,
                 cfg: ShardBuildConfig = ShardBuildConfig()) -> dict:
    """Tokenise the ingest artifact at `records_dir` into a shard set at `out_dir`. Returns the manifest."""
    return _build([("", Path(records_dir))], Path(out_dir), tokenizer, cfg, None)


def build_mixture_shards(records: dict[str, str | Path], mixture: MixtureConfig, out_dir: str | Path,
                         tokenizer: TokenizerConfig, cfg: ShardBuildConfig = ShardBuildConfig()) -> dict:
    """One shard set from several ingest artifacts (`records`: source name -> records directory), source by source
    in name order, with the manifest's `mixture` (weights, rows, shares) that its loader draws epochs by (align.
    data.mixture). Returns the manifest."""
    if set(records) != set(mixture.sources):
        raise ArtifactError(f"mixture sources {sorted(mixture.sources)} and records {sorted(records)} differ")
    parts = [(name, Path(records[name])) for name in sorted(records)]
    return _build(parts, Path(out_dir), tokenizer, cfg, mixture)
