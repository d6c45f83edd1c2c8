"""pretrain_checkpoint: optional continued pretraining on a raw-text corpus (configs/<profile>/pretrain.toml) ->
final/ (HF format). A profile without pretrain.toml has no such task.

Reads the local corpus files named by `[corpus.sources.*].path` (a `url` source is not a file doit can hash: it
reruns when the config changes) and the tokenizer."""

from __future__ import annotations

from pathlib import Path

from align.tokenizer.tokenizer import resolve_tokenizer_dir
from pipeline.layout import StageCtx
from pipeline.stage import StageSpec
from pipeline.stages.ingest import stage_table


def _inputs(ctx: StageCtx) -> list[Path]:
    corpus = stage_table(ctx.layout, "pretrain.toml", "corpus").get("sources", {})
    paths = [ctx.layout.root / src["path"] for _, src in sorted(corpus.items())
             if isinstance(src, dict) and isinstance(src.get("path"), str) and src["path"]]
    tokenizer_dir = Path(resolve_tokenizer_dir(stage_table(ctx.layout, "pretrain.toml", "tokenizer").get("path")))
    tok = tokenizer_dir if tokenizer_dir.is_absolute() else ctx.layout.root / tokenizer_dir
    return paths + [tok / "tokenizer.json"]


STAGE = StageSpec(
    name="pretrain_checkpoint",
    doc="continued pretraining on a raw-text mixture -> runs/<profile>/pretrain_checkpoint/final/",
    worker="align.stages.pretrain",
    config="pretrain.toml",
    file_dep=_inputs,
    targets=lambda ctx: [ctx.run_dir / "final" / "manifest.json"],
    heavy=True,
    distributed=True,
    optional=True,
    extra=True,  # not a dependency of tiny's SFT; `bash scripts/main.sh pretrain_checkpoint` builds it
)
