"""control_checkpoint: the no-RL control of the GRPO rung. More SFT on the SFT shards, run by the SFT stage's own
worker (align.stages.sft) on configs/<profile>/control.toml, starting where GRPO starts (`[model] base`: the DPO
checkpoint) and spending about GRPO's CPU seconds (`[train] max_steps`, calibrated by bench/norl_control.py).

An extra rung: only profiles with control.toml have it, and only `doit ... control_checkpoint golden_eval:control`
builds it (plain doit / main.sh do not; pipeline.frame keeps `golden_eval:control` out of them too, since it reads
this rung's checkpoint). `python bench/norl_control.py --profile P` compares the two rungs' held-out accuracy."""

from __future__ import annotations

from pipeline.stage import StageSpec
from pipeline.stages.sft import sft_inputs

CONFIG = "control.toml"

STAGE = StageSpec(
    name="control_checkpoint",
    doc="no-RL control: SFT from the DPO checkpoint for GRPO's CPU seconds -> runs/<profile>/control_checkpoint/final/",
    worker="align.stages.sft",
    config=CONFIG,
    file_dep=lambda ctx: sft_inputs(ctx, CONFIG),
    targets=lambda ctx: [ctx.run_dir / "final" / "manifest.json"],
    heavy=True,
    distributed=True,
    optional=True,
    extra=True,  # a comparison, not a rung of the product: `bash scripts/main.sh control_checkpoint` builds it
)
