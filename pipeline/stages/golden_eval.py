"""golden_eval:<stage>: one task per `[checkpoints]` entry of configs/<profile>/golden_eval.toml (sft, dpo, grpo):
the rung's checkpoint on the held-out eval split, judged, compared with the committed golden anchor.

Inputs: the checkpoint's manifest, the eval shards' manifest, and the anchor file when one is committed (so that
accepting a new anchor re-judges the stage; an absent anchor is not an input, the receipt says `no_anchor`)."""

from __future__ import annotations

from pathlib import Path

from pipeline.layout import Layout, StageCtx
from pipeline.stage import StageSpec
from pipeline.stages.ingest import stage_table

DEFAULT_CHECKPOINTS = {"sft": "sft_checkpoint/final", "dpo": "dpo_checkpoint/final", "grpo": "grpo_checkpoint/final"}
CONFIG = "golden_eval.toml"
# Extra rungs evaluated like the ladder's in a profile that has their stage config: variant -> (config, checkpoint).
# Their tasks read an extra rung's checkpoint, so plain doit leaves them out (pipeline.frame.default_tasks).
EXTRA_RUNGS = {"control": ("control.toml", "control_checkpoint/final")}


def checkpoints(layout: Layout) -> dict[str, str]:
    table = stage_table(layout, CONFIG, "checkpoints") or DEFAULT_CHECKPOINTS
    rungs = {k: v for k, v in table.items() if isinstance(v, str)}  # TOML order: the ladder's
    return rungs | {k: ckpt for k, ckpt in extra_rungs(layout).items() if k not in rungs}


def extra_rungs(layout: Layout) -> dict[str, str]:
    return {k: ckpt for k, (config, ckpt) in EXTRA_RUNGS.items() if (layout.configs / config).is_file()}


def _args(ctx: StageCtx) -> list[str]:
    """`stage=<variant>`; an extra rung that golden_eval.toml does not list gets its checkpoint as an override."""
    listed = stage_table(ctx.layout, CONFIG, "checkpoints")
    extra = extra_rungs(ctx.layout)
    own = [f"checkpoints.{ctx.variant}={extra[ctx.variant]}"] if ctx.variant in extra and ctx.variant not in listed \
        else []
    return [f"stage={ctx.variant}", *own]


def _inputs(ctx: StageCtx) -> list[Path]:
    runs = ctx.layout.runs
    ckpt = checkpoints(ctx.layout).get(ctx.variant, DEFAULT_CHECKPOINTS.get(ctx.variant, ""))
    evals = stage_table(ctx.layout, CONFIG, "data").get("eval", "shards/eval/out")
    deps = [runs / ckpt / "manifest.json", runs / str(evals) / "manifest.json"]
    anchors = stage_table(ctx.layout, CONFIG, "golden").get("anchors", "")
    anchor = ctx.layout.root / str(anchors) / f"{ctx.variant}.json"
    if anchors and anchor.is_file():
        deps.append(anchor)
    return deps


STAGE = StageSpec(
    name="golden_eval",
    doc="a rung's checkpoint on the held-out split: accuracy, pass@k, golden regression -> receipts/golden_eval-*",
    worker="align.stages.golden_eval",
    config=CONFIG,
    variants=lambda layout: list(checkpoints(layout)),
    args=_args,
    file_dep=_inputs,
    targets=lambda ctx: [ctx.run_dir / "out" / "manifest.json"],
    heavy=True,
)
