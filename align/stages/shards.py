"""align.stages.shards: an ingest artifact -> a token shard set (`shards:<split>`).

    python -m align.stages.shards --config configs/tiny/shards.toml split=sft

Reads `<runs>/ingest/<source>/out/` (the split's source, from `[splits]`; a source with a "/" is a records
directory under `<runs>`, such as `onpolicy_pairs/out`), publishes `<run_dir>/out/` (kind
"token_shards") and `<run_dir>/metrics.json` (rows, tokens, loss tokens, dropped). `<runs>` is $ALIGN_RUNS_DIR under
the pipeline, else runs/tiny.

A split under `[mixtures.<split>]` (sources = { <name> = <weight>, ... }, max_repetition, epoch_rows) is built from
several sources into one shard set (align.data.shard_build.build_mixture_shards); its metrics (the receipt) add the
target and realised share of each source."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from align.config import load_cli_config, run_dir_from_env, write_resolved_config
from align.data.mixture import MixtureConfig
from align.data.shard_build import ShardBuildConfig, build_mixture_shards, build_shards
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
    # split name -> several sources with weights (align.data.mixture); a split is in splits or mixtures, not both
    mixtures: dict[str, MixtureConfig] = field(default_factory=dict)
    split: str = ""  # the one this run builds (the pipeline passes `split=<name>`)


def records_dir(runs: Path, source: str) -> Path:
    """Where a split's records are: `<runs>/ingest/<source>/out` for an ingest source name, or `<runs>/<source>`
    when the source is a path (it holds a "/"), e.g. `onpolicy_pairs/out`, the records another stage published."""
    return runs / source if "/" in source else runs / "ingest" / source / "out"


def main() -> int:
    cfg = load_cli_config(ShardsStageConfig, prog="align.stages.shards")
    both = sorted(set(cfg.splits) & set(cfg.mixtures))
    if both:
        raise ConfigError(f"shards: split {both[0]!r} is in both [splits] and [mixtures]; keep one")
    if cfg.split not in cfg.splits and cfg.split not in cfg.mixtures:
        raise ConfigError(f"shards: split {cfg.split!r} is not configured; configured splits: "
                          f"{', '.join(sorted({*cfg.splits, *cfg.mixtures})) or '(none)'} (pass split=<name>)")
    runs = Path(os.environ.get("ALIGN_RUNS_DIR", "runs/tiny"))
    run_dir = run_dir_from_env(runs / "shards" / cfg.split)
    write_resolved_config(cfg, run_dir)
    if cfg.split in cfg.splits:
        manifest = build_shards(records_dir(runs, cfg.splits[cfg.split]), run_dir / "out", cfg.tokenizer, cfg.build)
    else:
        mixture = cfg.mixtures[cfg.split]
        records = {name: records_dir(runs, name) for name in mixture.sources}
        manifest = build_mixture_shards(records, mixture, run_dir / "out", cfg.tokenizer, cfg.build)
    metrics = {k: manifest[k] for k in METRIC_KEYS}
    if "mixture" in manifest:  # the receipt: target and realised shares of an epoch
        metrics["mixture"] = manifest["mixture"]
        for entry in manifest["mixture"]["sources"]:
            print(f"shards:{cfg.split}: {entry['name']}: share {entry['realised_share']:.4f} (target "
                  f"{entry['target_share']:.4f}), {entry['epoch_rows']} of {entry['rows']} rows an epoch")
    atomic_write_json(run_dir / "metrics.json", metrics)
    print(f"shards:{cfg.split}: {manifest['rows']} rows, {manifest['tokens']} tokens in "
          f"{len(manifest['shards'])} shards -> {run_dir / 'out'}")
    return 0


if __name__ == "__main__":
    exit_stage(main)
