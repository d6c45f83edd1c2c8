"""ppo_checkpoint: PPO with a critic from the DPO checkpoint (or the profile's `[data].start`) on the RL prompt
shards, the held-out prompts for the start/final accuracy (configs/<profile>/ppo.toml, `[data]` table). An extra
rung: only profiles with ppo.toml have it, and only `doit ... ppo_checkpoint` builds it (plain doit / main.sh and
the smoke ladder do not)."""

from __future__ import annotations

from pathlib import Path

from pipeline.layout import StageCtx
from pipeline.stage import StageSpec
from pipeline.stages.grpo import DEFAULTS, reward_term_manifests  # the same inputs as GRPO's
from pipeline.stages.ingest import inloop_manifests, stage_table, table_manifests


def _inputs(ctx: StageCtx) -> list[Path]:
    """GRPO's inputs, the in-loop sets, and the reward model's (and the process reward model's) manifest when
    `[reward] model` (`process_model`) names one, or a `[reward] terms` model term does (so doit builds it first)."""
    reward = stage_table(ctx.layout, "ppo.toml", "reward")
    rm = [ctx.layout.runs / reward[key] / "manifest.json" for key in ("model", "process_model")
          if isinstance(reward.get(key), str) and reward[key]]
    return (table_manifests(ctx.layout, "ppo.toml", "data", DEFAULTS) + inloop_manifests(ctx.layout, "ppo.toml") + rm
            + reward_term_manifests(ctx, "ppo.toml"))


STAGE = StageSpec(
    name="ppo_checkpoint",
    doc="PPO (policy + critic) on verifier rewards from the DPO checkpoint -> runs/<profile>/ppo_checkpoint/final/",
    worker="align.stages.ppo",
    config="ppo.toml",
    file_dep=_inputs,
    targets=lambda ctx: [ctx.run_dir / "final" / "manifest.json"],
    heavy=True,
    optional=True,
    extra=True,  # beside GRPO, not a dependency of anything: `bash scripts/main.sh ppo_checkpoint` builds it
)
