"""rm_prompts -> rm_pairs -> rm_shards: the reward model's own verifier-labelled preference pairs, made by the
ladder's existing workers on their own configs (configs/<profile>/rm_prompts.toml, rm_pairs.toml, rm_shards.toml):
ingest of the bundle's math_rm_pairs prompts, the SFT policy's judged samples on them (as `onpolicy_pairs`), their
token shards. Optional (a profile without a config has no task) and extra (built only when named, or when
rm_checkpoint reads `rm_shards/out`): the DPO rung's pairs and the default ladder are untouched."""

from __future__ import annotations

from pathlib import Path

from pipeline.layout import StageCtx
from pipeline.stage import StageSpec
from pipeline.stages.ingest import stage_table, table_manifests
from pipeline.stages.onpolicy_pairs import DEFAULTS as PAIRS_DEFAULTS
from pipeline.stages.shards import split_inputs

SOURCE, SPLIT = "math_rm_pairs", "rm"  # the one source / split each config names


def _prompt_file(ctx: StageCtx) -> list[Path]:
    source = stage_table(ctx.layout, "rm_prompts.toml", "sources").get(SOURCE, {})
    return [ctx.layout.root / source["path"]] if isinstance(source, dict) and "path" in source else []


def _pairs_inputs(ctx: StageCtx) -> list[Path]:
    return table_manifests(ctx.layout, "rm_pairs.toml", "data", {**PAIRS_DEFAULTS, "source": "rm_prompts/out"})


def _shards_inputs(ctx: StageCtx) -> list[Path]:
    return split_inputs(ctx.layout, "rm_shards.toml", SPLIT)


def _out(ctx: StageCtx) -> list[Path]:
    return [ctx.run_dir / "out" / "manifest.json"]


STAGES = (
    StageSpec(name="rm_prompts", doc="the reward model's pair prompts -> runs/<profile>/rm_prompts/out/",
              worker="align.stages.ingest", config="rm_prompts.toml", args=lambda ctx: [f"source={SOURCE}"],
              file_dep=_prompt_file, targets=_out, optional=True, extra=True),
    StageSpec(name="rm_pairs", doc="the SFT policy's judged samples on them -> runs/<profile>/rm_pairs/out/",
              worker="align.stages.onpolicy_pairs", config="rm_pairs.toml", file_dep=_pairs_inputs, targets=_out,
              heavy=True, optional=True, extra=True),
    StageSpec(name="rm_shards", doc="their token shards -> runs/<profile>/rm_shards/out/",
              worker="align.stages.shards", config="rm_shards.toml", args=lambda ctx: [f"split={SPLIT}"],
              file_dep=_shards_inputs, targets=_out, optional=True, extra=True),
)
