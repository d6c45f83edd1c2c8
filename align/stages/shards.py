"""align.stages.shards: an ingest artifact -> a token shard set (`shards:<split>`).

    python -m align.stages.shards --config configs/tiny/shards.toml split=sft

Reads `<runs>/ingest/<source>/out/` (the split's source, from `[splits]`; a source with a "/" is a records
directory under `<runs>`, such as `onpolicy_pairs/out`), publishes `<run_dir>/out/` (kind
"token_shards") and `<run_dir>/metrics.json` (rows, tokens, loss tokens, dropped). `<runs>` is $ALIGN_RUNS_DIR under
the pipeline, else runs/tiny."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from align.config import load_cli_config, run_dir_from_env, write_resolved_config
from align.data.shard_build import ShardBuildConfig, build_shards
from align.exceptions import ConfigError
from align.exit_codes import exit_stage
from align.tokenizer import TokenizerConfig
from align.utils.fsio import atomic_write_json

METRIC_KEYS = ("rows", "sequences", "tokens", "loss_tokens", "dropped_too_long", "truncated", "reused_shards")


@dataclass(frozen=True)
class ShardsStageConfig:
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    build: ShardBuildConfig = field(default_factory=ShardBuildConfig)
    splits: dict[str, str] = field(default_factory=dict)  # split name -> ingest source name, or a records dir (below)
    split: str = ""  # the one this run builds (the pipeline passes `split=<name>`)


def records_dir(runs: Path, source: str) -> Path:
    """Where a split's records are: `<runs>/ingest/<source>/out` for an ingest source name, or `<runs>/<source>`
    when the source is a path (it holds a "/"), e.g. `onpolicy_pairs/out`, the records another stage published."""
    return runs / source if "/" in source else runs / "ingest" / source / "out"


def main() -> int:
    cfg = load_cli_config(ShardsStageConfig, prog="align.stages.shards")
    if cfg.split not in cfg.splits:
        raise ConfigError(f"shards: split {cfg.split!r} is not configured; configured splits: "
                          f"{', '.join(sorted(cfg.splits)) or '(none)'} (pass split=<name>)")
    runs = Path(os.environ.get("ALIGN_RUNS_DIR", "runs/tiny"))
    run_dir = run_dir_from_env(runs / "shards" / cfg.split)
    write_resolved_config(cfg, run_dir)
    records = records_dir(runs, cfg.splits[cfg.split])
    manifest = build_shards(records, run_dir / "out", cfg.tokenizer, cfg.build)
    atomic_write_json(run_dir / "metrics.json", {k: manifest[k] for k in METRIC_KEYS})
    print(f"shards:{cfg.split}: {manifest['rows']} rows, {manifest['tokens']} tokens in "
          f"{len(manifest['shards'])} shards -> {run_dir / 'out'}")
    return 0


if __name__ == "__main__":
    exit_stage(main)
