"""dpo_checkpoint: DPO from the SFT checkpoint against the cached reference log-probs (configs/<profile>/dpo.toml).
Reads the SFT checkpoint, the preference shards and their ref cache (paths from the config's [data] table)."""

from __future__ import annotations

from pathlib import Path

from pipeline.layout import StageCtx
from pipeline.stage import StageSpec
from pipeline.stages.ingest import inloop_manifests, table_manifests

DEFAULTS = {"reference": "sft_checkpoint/final", "pairs": "shards/preference/out", "ref_cache": "ref_cache/preference"}


def _inputs(ctx: StageCtx) -> list[Path]:
    return table_manifests(ctx.layout, "dpo.toml", "data", DEFAULTS) + inloop_manifests(ctx.layout, "dpo.toml")


STAGE = StageSpec(
    name="dpo_checkpoint",
    doc="DPO from the SFT checkpoint on cached reference log-probs -> runs/<profile>/dpo_checkpoint/final/",
    worker="align.stages.dpo",
    config="dpo.toml",
    file_dep=_inputs,
    targets=lambda ctx: [ctx.run_dir / "final" / "manifest.json"],
    heavy=True,
    distributed=True,
)
