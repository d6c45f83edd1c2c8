"""ingest:<source>: one task per `[sources.<name>]` of configs/<profile>/ingest.toml."""

from __future__ import annotations

from pathlib import Path

from align.config import read_toml
from align.data.decontam import DecontamConfig
from align.data.evalsets import EVALSETS, get_evalset
from align.data.readers import source_files
from align.exceptions import ConfigError, DataError
from pipeline.layout import Layout, StageCtx
from pipeline.stage import StageSpec


def stage_table(layout: Layout, config: str, table: str) -> dict:
    """A table of a stage config, read at task-creation time; {} when the file is missing or malformed (the task
    then reports the config problem when it runs, and `doit list` still works)."""
    try:
        value = read_toml(layout.configs / config).get(table, {})
    except ConfigError:
        return {}
    return value if isinstance(value, dict) else {}


def table_manifests(layout: Layout, config: str, table: str, defaults: dict[str, str]) -> list[Path]:
    """The manifests of the artifacts a config table names (paths relative to runs/<profile>), in `defaults` order;
    a key that is absent or not a string falls back to its default."""
    data = stage_table(layout, config, table)
    paths = [data[k] if isinstance(data.get(k), str) else v for k, v in defaults.items()]
    return [layout.runs / p / "manifest.json" for p in paths]


INLOOP_DEFAULTS = {"prompts": "shards/eval/out", "solutions": "shards/eval_sft/out"}  # align.eval.inloop_config


def inloop_manifests(layout: Layout, config: str) -> list[Path]:
    """The held-out shard sets a stage's `[inloop_eval]` reads (none when it is off or the table is absent)."""
    table = stage_table(layout, config, "inloop_eval")
    if not table.get("every"):
        return []
    paths = [table[k] if isinstance(table.get(k), str) else v for k, v in INLOOP_DEFAULTS.items()]
    return [layout.runs / p / "manifest.json" for p in paths if p]


def _source_path(ctx: StageCtx) -> list[Path]:
    sources = stage_table(ctx.layout, "ingest.toml", "sources")
    source = sources.get(ctx.variant, {})
    own = _local_files(ctx.layout, source.get("path")) if isinstance(source, dict) else []
    return own + [p for p in _reference_paths(ctx.layout, sources) if p not in own]


def _local_files(layout: Layout, path) -> list[Path]:
    """A source's local files: its path, or a glob's matches (none: the task reports it when it runs)."""
    if not isinstance(path, str) or not path:
        return []
    try:
        return [layout.root / p for p, _ in source_files(path, "", (), layout.root)]
    except DataError:
        return []


def _reference_paths(layout: Layout, sources: dict) -> list[Path]:
    """The local files of the evaluation sets every source is checked against (align.data.decontam): a changed
    eval set re-runs the check."""
    table = stage_table(layout, "ingest.toml", "decontam")
    evalsets, heldout = table.get("evalsets", DecontamConfig.evalsets), table.get("heldout", ())
    paths = []
    for name in evalsets if isinstance(evalsets, (list, tuple)) else ():
        if name in EVALSETS and get_evalset(name).source.path:
            paths.append(layout.root / get_evalset(name).source.path)
    for name in heldout if isinstance(heldout, (list, tuple)) else ():
        entry = sources.get(name)
        if isinstance(entry, dict):
            paths += _local_files(layout, entry.get("path"))
    return sorted(set(paths))


STAGE = StageSpec(
    name="ingest",
    doc="parquet -> validated, de-duplicated records -> runs/<profile>/ingest/<source>/out/",
    worker="align.stages.ingest",
    config="ingest.toml",
    variants=lambda layout: sorted(stage_table(layout, "ingest.toml", "sources")),
    args=lambda ctx: [f"source={ctx.variant}"],
    file_dep=_source_path,
    targets=lambda ctx: [ctx.run_dir / "out" / "manifest.json"],
)
