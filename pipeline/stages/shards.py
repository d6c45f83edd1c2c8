"""shards:<split>: one task per entry of `[splits]` in configs/<profile>/shards.toml (split -> ingest source, or a
records directory under runs/<profile> such as `onpolicy_pairs/out`) and per `[mixtures.<split>]` (several sources
with weights, align.data.mixture)."""

from __future__ import annotations

from pathlib import Path

from align.stages.shards import records_dir
from align.tokenizer.tokenizer import resolve_tokenizer_dir
from pipeline.layout import Layout, StageCtx
from pipeline.stage import StageSpec
from pipeline.stages.ingest import stage_table


def split_inputs(layout: Layout, config: str, split: str | None) -> list[Path]:
    """What the shards worker reads for `split` of a shards config: the tokenizer file and the split's records."""
    source = stage_table(layout, config, "splits").get(split)
    mixture = stage_table(layout, config, "mixtures").get(split)
    sources = mixture.get("sources") if isinstance(mixture, dict) else None
    tokenizer = stage_table(layout, config, "tokenizer").get("path")
    tokenizer_dir = resolve_tokenizer_dir(tokenizer)
    if not tokenizer_dir.is_absolute():
        tokenizer_dir = layout.root / tokenizer_dir
    deps = [tokenizer_dir / "tokenizer.json"]
    if isinstance(source, str):
        deps.append(records_dir(layout.runs, source) / "manifest.json")
    if isinstance(sources, dict):  # a mixture: every source's records
        deps += [records_dir(layout.runs, name) / "manifest.json" for name in sorted(sources)]
    return deps


def _inputs(ctx: StageCtx) -> list[Path]:
    return split_inputs(ctx.layout, "shards.toml", ctx.variant)


STAGE = StageSpec(
    name="shards",
    doc="records -> chat-templated token shards with loss masks -> runs/<profile>/shards/<split>/out/",
    worker="align.stages.shards",
    config="shards.toml",
    variants=lambda layout: sorted({*stage_table(layout, "shards.toml", "splits"),
                                    *stage_table(layout, "shards.toml", "mixtures")}),
    args=lambda ctx: [f"split={ctx.variant}"],
    file_dep=_inputs,
    targets=lambda ctx: [ctx.run_dir / "out" / "manifest.json"],
)
