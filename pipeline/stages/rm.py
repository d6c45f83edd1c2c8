"""rm_checkpoint: optional Bradley-Terry reward model from the SFT checkpoint on the preference shards
(configs/<profile>/rm.toml) -> final/ (HF MistralForSequenceClassification). A profile without rm.toml has no such
task; an extra rung: built only when named (`bash scripts/main.sh rm_checkpoint`), never by plain `doit`. Tiny's
pairs are its own (`rm_shards/out`, pipeline/stages/rm_pairs.py): naming rm_checkpoint builds those rungs first."""

from __future__ import annotations

from pathlib import Path

from pipeline.layout import StageCtx
from pipeline.stage import StageSpec
from pipeline.stages.ingest import stage_table, table_manifests

DEFAULTS = {"init": "sft_checkpoint/final", "pairs": "shards/preference/out"}  # align.stages.rm.RmDataConfig


def _inputs(ctx: StageCtx) -> list[Path]:
    compare = stage_table(ctx.layout, "rm.toml", "data").get("compare_pairs")  # optional (default "": none)
    extra = [ctx.layout.runs / compare / "manifest.json"] if isinstance(compare, str) and compare else []
    return table_manifests(ctx.layout, "rm.toml", "data", DEFAULTS) + extra


STAGE = StageSpec(
    name="rm_checkpoint",
    doc="Bradley-Terry reward model from the SFT trunk on the preference pairs -> runs/<profile>/rm_checkpoint/final/",
    worker="align.stages.rm",
    config="rm.toml",
    file_dep=_inputs,
    targets=lambda ctx: [ctx.run_dir / "final" / "manifest.json"],
    heavy=True,
    distributed=True,
    optional=True,
    extra=True,  # no rung consumes it yet (PPO may); the default ladder's wall time is unchanged
)
