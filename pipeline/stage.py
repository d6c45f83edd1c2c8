"""Stage declarations: one `StageSpec` per ladder stage, each in its own file under `pipeline/stages/`.

A stage file defines `STAGE = StageSpec(...)` (or `STAGES = (...)`); `discover()` imports every module of the
`pipeline.stages` package and orders what it finds by `LADDER`. A stage whose file does not exist yet is simply not
part of the DAG. Adding a stage touches no shared file (docs/PIPELINE.md, "Adding a stage")."""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

from pipeline.layout import Layout, StageCtx

# The ladder, in build order; `doit list` shows the tasks in this order. `smoke` is the aggregate (pipeline/smoke.py).
LADDER = ("ingest", "shards", "pretrain_checkpoint", "sft_checkpoint", "onpolicy_pairs", "ref_cache", "dpo_checkpoint",
          "rm_prompts", "rm_pairs", "rm_shards", "rm_checkpoint", "prm_checkpoint", "grpo_checkpoint", "ppo_checkpoint", "control_checkpoint",
          "golden_eval")
SMOKE = "smoke"


def _no_paths(ctx: StageCtx) -> Sequence[Path]:
    return ()


def _no_args(ctx: StageCtx) -> Sequence[str]:
    return ()


@dataclass(frozen=True)
class StageSpec:
    """What the DAG needs to know about one stage; every path is a function of the profile's layout.

    The worker is launched as `python -m <worker> --config <config> [args...]` with the stage's run directory in
    `$ALIGN_RUN_DIR`; it must publish every target atomically (align.utils.fsio) and exit 0 only when it has."""

    name: str  # doit task basename, one of LADDER
    doc: str  # one line, shown by `doit list`
    worker: str  # module run with `python -m`, e.g. "align.stages.sft"
    config: str | Callable[[StageCtx], Path]  # file name in configs/<profile>/ ("{variant}" is filled in), or a path
    targets: Callable[[StageCtx], Sequence[Path]]  # files the worker publishes (for a directory: its manifest.json)
    file_dep: Callable[[StageCtx], Sequence[Path]] = _no_paths  # files it reads (upstream manifests, inputs)
    heavy: bool = False  # host preflight + the heavy-job lock around the worker
    distributed: bool = False  # launch under torchrun when the profile's world_size > 1
    code: tuple[str, ...] = ()  # modules beyond the worker whose import closure joins the code digest
    variants: Callable[[Layout], Sequence[str]] | None = None  # subtasks `name:<variant>`, e.g. one per source
    args: Callable[[StageCtx], Sequence[str]] = _no_args  # extra `table.key=value` overrides for the worker
    optional: bool = False  # a profile without the stage's config file has no task for it (not an error)
    # An extra rung is built only when asked for by name (`bash scripts/main.sh ppo_checkpoint`), never by plain
    # `doit`: the default ladder's wall time stays what the README promises when a profile grows a side rung.
    extra: bool = False

    def contexts(self, layout: Layout) -> list[StageCtx]:
        if self.optional and self.variants is None and not self.config_path(StageCtx(layout, self.name)).is_file():
            return []
        if self.variants is None:
            return [StageCtx(layout, self.name)]
        return [StageCtx(layout, self.name, v) for v in self.variants(layout)]

    def config_path(self, ctx: StageCtx) -> Path:
        if callable(self.config):
            return Path(self.config(ctx))
        return ctx.configs / self.config.format(variant=ctx.variant or "")

    def code_modules(self) -> tuple[str, ...]:
        return (self.worker, *self.code)

    @property
    def listing(self) -> str:
        """What `doit list` shows: the doc and the worker's file, so a rung's code is one step from its task name."""
        return f"{self.doc}  [{self.worker.replace('.', '/')}.py]"


def order_stages(stages: Iterable[StageSpec], ladder: Sequence[str] = LADDER) -> list[StageSpec]:
    """Stages sorted by ladder position; a duplicate or an off-ladder name is a declaration error."""
    by_name: dict[str, StageSpec] = {}
    for spec in stages:
        if spec.name not in ladder:
            raise ValueError(f"stage {spec.name!r} is not on the ladder ({', '.join(ladder)})")
        if spec.name in by_name:
            raise ValueError(f"stage {spec.name!r} is declared twice")
        by_name[spec.name] = spec
    return [by_name[name] for name in ladder if name in by_name]


def discover(package: str = "pipeline.stages") -> list[StageSpec]:
    """Import every module of `package` and collect its `STAGE` / `STAGES`, in ladder order."""
    pkg = importlib.import_module(package)
    found: list[StageSpec] = []
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{package}.{info.name}")
        if hasattr(module, "STAGE"):
            found.append(module.STAGE)
        found.extend(getattr(module, "STAGES", ()))
    return order_stages(found)
