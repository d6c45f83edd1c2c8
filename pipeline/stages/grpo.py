"""grpo_checkpoint: GRPO from the DPO checkpoint (or the profile's `[data].start`) on the RL prompt shards, with the
held-out prompts for the start/final accuracy (configs/<profile>/grpo.toml, `[data]` table)."""

from __future__ import annotations

from pathlib import Path

from pipeline.layout import StageCtx
from pipeline.stage import StageSpec
from pipeline.stages.ingest import inloop_manifests, stage_table

DEFAULTS = {"start": "dpo_checkpoint/final", "prompts": "shards/prompts/out", "eval": "shards/eval/out"}


MODEL_TERMS = ("reward_model", "process_reward_model")  # [reward] terms that load a checkpoint (`path`)


def reward_term_manifests(ctx: StageCtx, config: str) -> list[Path]:
    """The manifests of the checkpoints `[reward] terms` names (align.rl.reward_terms), so doit builds them first."""
    terms = stage_table(ctx.layout, config, "reward").get("terms")
    return [ctx.layout.runs / t["path"] / "manifest.json" for t in (terms if isinstance(terms, list) else [])
            if isinstance(t, dict) and t.get("name") in MODEL_TERMS and isinstance(t.get("path"), str)]


def _inputs(ctx: StageCtx) -> list[Path]:
    data = stage_table(ctx.layout, "grpo.toml", "data")
    paths = [data[k] if isinstance(data.get(k), str) else v for k, v in DEFAULTS.items()]
    return ([ctx.layout.runs / p / "manifest.json" for p in paths] + inloop_manifests(ctx.layout, "grpo.toml")
            + reward_term_manifests(ctx, "grpo.toml"))


STAGE = StageSpec(
    name="grpo_checkpoint",
    doc="GRPO on verifier rewards from the DPO checkpoint -> runs/<profile>/grpo_checkpoint/final/",
    worker="align.stages.grpo",
    config="grpo.toml",
    file_dep=_inputs,
    targets=lambda ctx: [ctx.run_dir / "final" / "manifest.json"],
    heavy=True,
    distributed=True,
)
