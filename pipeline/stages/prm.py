"""prm_checkpoint: optional process reward model from the SFT checkpoint on the on-policy pairs' solutions, each
line labelled by rule (configs/<profile>/prm.toml) -> final/ (HF MistralForTokenClassification). A profile without
prm.toml has no such task; an extra rung: built only when named (`doit profile=tiny prm_checkpoint`), and by the
ppo task when its `[reward] process_model` names it."""

from __future__ import annotations

from pathlib import Path

from pipeline.layout import StageCtx
from pipeline.stage import StageSpec
from pipeline.stages.ingest import table_manifests

DEFAULTS = {"init": "sft_checkpoint/final", "records": "onpolicy_pairs/out"}  # align.stages.prm.PrmDataConfig


def _inputs(ctx: StageCtx) -> list[Path]:
    return table_manifests(ctx.layout, "prm.toml", "data", DEFAULTS)


STAGE = StageSpec(
    name="prm_checkpoint",
    doc="process reward model from the SFT trunk on rule-labelled solution steps -> runs/<profile>/prm_checkpoint/final/",
    worker="align.stages.prm",
    config="prm.toml",
    file_dep=_inputs,
    targets=lambda ctx: [ctx.run_dir / "final" / "manifest.json"],
    heavy=True,
    optional=True,
    extra=True,
)
