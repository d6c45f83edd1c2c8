"""align.stages.ref_cache: reference (SFT) log-probs of every preference pair, computed once (`ref_cache`).

    python -m align.stages.ref_cache --config configs/tiny/ref_cache.toml

For each `[splits]` entry (cache name -> preference shard set under `<runs>`), publishes `<run_dir>/<name>/`: the
summed log-probs and token counts of both arms of every pair under the reference checkpoint, in eval mode, without
gradients, batched by length, on every core, keyed by (checkpoint content hash, shard manifest digest, tokenizer
hash, precision) (align.train.ref_cache). A cache whose key still matches is reused without loading the model.
`<run_dir>/metrics.json`: rows, hit or built, and the reference's own preference accuracy on the pairs.
`<runs>` is $ALIGN_RUNS_DIR under the pipeline, else runs/tiny."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from align.config import load_cli_config, run_dir_from_env, write_resolved_config
from align.data.collate import collate
from align.data.store import ShardSet
from align.exit_codes import exit_stage
from align.model.checkpoint import DTYPES
from align.profile import CommonConfig
from align.tokenizer import Tokenizer, TokenizerConfig
from align.kernels.fused_dpo import pair_logprobs
from align.train.ref_cache import cache_key, cached_preference_accuracy, ensure_ref_cache, length_sorted_rows
from align.utils.dist import device
from align.utils.fsio import atomic_write_json

@dataclass(frozen=True)
class RefScoringConfig:
    """[scoring] table: how the reference forward runs (dtype is part of the cache key)."""

    batch_pairs: int = 16  # pairs per forward (both arms: 2x sequences)
    max_tokens: int | None = None  # and at most this many pairs x padded width per forward
    dtype: Literal["float32", "bfloat16"] = "float32"
    chunk_size: int = 1024  # completion tokens per logits chunk of the fused head
    threads: int = 0  # torch CPU threads; 0: every core


@dataclass(frozen=True, kw_only=True)
class RefCacheStageConfig(CommonConfig):
    reference: str = "sft_checkpoint/final"  # the reference checkpoint, relative to <runs> (or absolute)
    splits: dict[str, str] = field(default_factory=lambda: {"preference": "shards/preference/out"})
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    scoring: RefScoringConfig = field(default_factory=RefScoringConfig)


def tokenizer_hash(cfg: TokenizerConfig) -> str:
    """The identity shards record (`Tokenizer.content_hash`: the file's sha256, a Jinja chat template folded in)."""
    return Tokenizer.from_config(cfg).content_hash


def _prepare(reference: Path, shards: ShardSet, scoring: RefScoringConfig):
    """Load the reference model and plan the batches: only on a cache miss."""
    from align.model.checkpoint import load_checkpoint

    model = load_checkpoint(reference, dtype=DTYPES[scoring.dtype], device=device()).eval()
    plan = length_sorted_rows(shards.row_lengths, scoring.batch_pairs, scoring.max_tokens)
    batches = (collate(shards, rows) for rows in plan)

    @torch.no_grad()
    def score(batch: dict):
        s = pair_logprobs(model, batch, scoring.chunk_size)
        return s.chosen, s.rejected, s.chosen_tokens, s.rejected_tokens

    return batches, score


def main() -> int:
    cfg = load_cli_config(RefCacheStageConfig, prog="align.stages.ref_cache")
    runs = Path(os.environ.get("ALIGN_RUNS_DIR", "runs/tiny"))
    run_dir = run_dir_from_env(runs / "ref_cache")
    write_resolved_config(cfg, run_dir)
    torch.set_num_threads(cfg.scoring.threads or os.cpu_count() or 1)
    reference, tok_hash = runs / cfg.reference, tokenizer_hash(cfg.tokenizer)
    metrics = {}
    for name, rel in sorted(cfg.splits.items()):
        start = time.monotonic()
        shards = ShardSet.open(runs / rel, kind="pairs", tokenizer_hash=tok_hash)
        key = cache_key(reference, shards.digest, tok_hash, cfg.scoring.dtype)
        cache, hit = ensure_ref_cache(run_dir / name, key, len(shards),
                                      lambda: _prepare(reference, shards, cfg.scoring),
                                      extra={"shards_path": str(shards.path)})
        metrics[name] = {"rows": len(shards), "hit": hit, "seconds": round(time.monotonic() - start, 2),
                         "reference_preference_accuracy": cached_preference_accuracy(cache),
                         "cache_key": key.digest()}
        print(f"ref_cache:{name}: {'hit' if hit else 'built'} {len(shards)} pairs -> {run_dir / name} "
              f"({metrics[name]['seconds']} s)")
    atomic_write_json(run_dir / "metrics.json", metrics)
    return 0


if __name__ == "__main__":
    exit_stage(main)
