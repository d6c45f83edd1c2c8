"""What a dodo file calls: `install(namespace, ...)` puts DOIT_CONFIG and one task creator into it.

One creator yields every ladder task under its own basename, so `doit list` shows them in ladder order, and plain
`doit` builds every stage (not `smoke`, which is the CI entry point)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from pipeline import exitcode
from pipeline.layout import Project
from pipeline.profiles import selected_profile
from pipeline.smoke import smoke_task
from pipeline.stage import StageSpec, discover
from pipeline.tasks import doit_config, ladder_tasks, prepare_runs


def install(namespace: dict, project: Project | None = None, stages: Sequence[StageSpec] | None = None,
            profile: str | None = None) -> None:
    """Fill a dodo module's namespace. `stages` default: every `pipeline/stages/*.py` declaration."""
    project = project or Project()
    profile = profile or selected_profile()
    stages = list(stages) if stages is not None else discover()
    dodo = Path(namespace["__file__"]).resolve()
    exitcode.install()
    prepare_runs(project, profile)
    namespace["DOIT_CONFIG"] = {**doit_config(project, profile), "default_tasks": [s.name for s in stages]}

    def task_ladder():
        """the align stage ladder"""
        yield from ladder_tasks(project, profile, stages)
        yield smoke_task(project, profile, stages, dodo)

    namespace["task_ladder"] = task_ladder
