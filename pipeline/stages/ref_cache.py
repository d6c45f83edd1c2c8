"""ref_cache: reference log-probs of every preference pair (configs/<profile>/ref_cache.toml, one cache per
`[splits]` entry). Reruns when the SFT checkpoint or the shards change; the worker then reuses a cache whose
content key still matches, so a byte-identical upstream rebuild publishes nothing new."""

from __future__ import annotations

from pathlib import Path

from align.config import read_toml
from align.exceptions import ConfigError
from pipeline.layout import StageCtx
from pipeline.stage import StageSpec

DEFAULT_REFERENCE = "sft_checkpoint/final"
DEFAULT_SPLITS = {"preference": "shards/preference/out"}


def ref_cache_plan(ctx: StageCtx) -> tuple[str, dict[str, str]]:
    """(reference dir, {cache name: shard dir}) relative to runs/<profile>, as the worker reads them; the
    defaults when the config is missing or malformed (the worker then reports the problem)."""
    try:
        data = read_toml(ctx.configs / "ref_cache.toml")
    except ConfigError:
        data = {}
    reference = data.get("reference", DEFAULT_REFERENCE)
    splits = data.get("splits", DEFAULT_SPLITS)
    return (reference if isinstance(reference, str) else DEFAULT_REFERENCE,
            splits if isinstance(splits, dict) else DEFAULT_SPLITS)


def _inputs(ctx: StageCtx) -> list[Path]:
    reference, splits = ref_cache_plan(ctx)
    runs = ctx.layout.runs
    return [runs / reference / "manifest.json", *(runs / rel / "manifest.json" for _, rel in sorted(splits.items()))]


STAGE = StageSpec(
    name="ref_cache",
    doc="reference (SFT) log-probs of every preference pair, content-keyed -> runs/<profile>/ref_cache/<split>/",
    worker="align.stages.ref_cache",
    config="ref_cache.toml",
    file_dep=_inputs,
    targets=lambda ctx: [ctx.run_dir / name / "manifest.json" for name in sorted(ref_cache_plan(ctx)[1])],
    heavy=True,
)
