"""onpolicy_pairs: preference pairs from the SFT policy's own judged samples (configs/<profile>/onpolicy_pairs.toml).
Reruns when the policy checkpoint or the source pairs change; `shards:<split>` reads its `out/` when `[splits]`
names `onpolicy_pairs/out`. A profile without the config file has no such task."""

from __future__ import annotations

from pathlib import Path

from pipeline.layout import StageCtx
from pipeline.stage import StageSpec
from pipeline.stages.ingest import table_manifests

CONFIG = "onpolicy_pairs.toml"
DEFAULTS = {"policy": "sft_checkpoint/final", "source": "ingest/math_pairs/out"}


def _inputs(ctx: StageCtx) -> list[Path]:
    return table_manifests(ctx.layout, CONFIG, "data", DEFAULTS)


STAGE = StageSpec(
    name="onpolicy_pairs",
    doc="the SFT policy's judged samples -> preference pair records -> runs/<profile>/onpolicy_pairs/out/",
    worker="align.stages.onpolicy_pairs",
    config=CONFIG,
    file_dep=_inputs,
    targets=lambda ctx: [ctx.run_dir / "out" / "manifest.json"],
    heavy=True,
    optional=True,
)
