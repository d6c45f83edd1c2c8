"""sft_checkpoint: supervised fine-tuning on the SFT shards (configs/<profile>/sft.toml) -> final/ (HF format).

Reads the shard set named by the config's `[data].shards` (relative to runs/<profile>), the tokenizer, and, when
`[model].base` is set, the base checkpoint's config.json and index (not its multi-GB weights: doit would hash them
on every run; a snapshot directory is immutable in practice). A base under runs/<profile>/ (e.g. the optional
`pretrain_checkpoint` rung's `final/`) is another stage's artifact: its manifest is a dependency, so doit orders
the two stages."""

from __future__ import annotations

from pathlib import Path

from align.tokenizer.tokenizer import resolve_tokenizer_dir
from pipeline.layout import StageCtx
from pipeline.stage import StageSpec
from pipeline.stages.ingest import inloop_manifests, stage_table


def _under(root: Path, path: str | Path) -> Path:
    return Path(path) if Path(path).is_absolute() else root / path


def _inputs(ctx: StageCtx) -> list[Path]:
    return sft_inputs(ctx, "sft.toml")


def sft_inputs(ctx: StageCtx, config: str) -> list[Path]:
    """The inputs of an `align.stages.sft` run on `config` (this rung's, and the extra `control_checkpoint`'s)."""
    shards = stage_table(ctx.layout, config, "data").get("shards", "shards/sft/out")
    tokenizer_dir = resolve_tokenizer_dir(stage_table(ctx.layout, config, "tokenizer").get("path"))
    deps = [ctx.layout.runs / str(shards) / "manifest.json", _under(ctx.layout.root, tokenizer_dir) / "tokenizer.json"]
    base = stage_table(ctx.layout, config, "model").get("base")
    if isinstance(base, str) and base:
        base_dir = _under(ctx.layout.root, base)
        if base_dir.absolute().is_relative_to(ctx.layout.runs.absolute()):
            # a checkpoint a stage of this profile publishes (pretrain_checkpoint/final): its manifest, there or
            # not yet, so doit builds that stage first (or reports the task blocked when none produces it)
            deps.append(base_dir / "manifest.json")
        else:
            deps += [p for p in (base_dir / "config.json", base_dir / "model.safetensors.index.json") if p.is_file()]
    return deps + inloop_manifests(ctx.layout, config)


STAGE = StageSpec(
    name="sft_checkpoint",
    doc="supervised fine-tuning on the SFT shards -> runs/<profile>/sft_checkpoint/final/",
    worker="align.stages.sft",
    config="sft.toml",
    file_dep=_inputs,
    targets=lambda ctx: [ctx.run_dir / "final" / "manifest.json"],
    heavy=True,
    distributed=True,
)
