"""What a dodo file calls: `install(namespace, ...)` puts DOIT_CONFIG and one task creator into it.

One creator yields every ladder task under its own basename, so `doit list` shows them in ladder order, and plain
`doit` builds every stage but the extra rungs (`StageSpec.extra`: built when named) and `smoke` (the CI entry point),
then the `report` (pipeline/report.py): the ladder ends with its page."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from pipeline import exitcode
from pipeline.layout import Project
from pipeline.profiles import selected_profile
from pipeline.report import report_task
from pipeline.smoke import smoke_task
from pipeline.stage import StageSpec, discover
from pipeline.tasks import blocked_tasks, doit_config, ladder_tasks, prepare_runs, task_name
from pipeline.verify import verify_task


def install(namespace: dict, project: Project | None = None, stages: Sequence[StageSpec] | None = None,
            profile: str | None = None) -> None:
    """Fill a dodo module's namespace. `stages` default: every `pipeline/stages/*.py` declaration.

    Plain `doit` (and `smoke`) build the runnable tasks: a task whose input no declared stage produces (the ladder
    is still incomplete) is listed and can be asked for by name, where it fails naming the missing input."""
    project = project or Project()
    profile = profile or selected_profile()
    stages = list(stages) if stages is not None else discover()
    dodo = Path(namespace["__file__"]).resolve()
    exitcode.install()
    prepare_runs(project, profile)
    tasks = list(ladder_tasks(project, profile, stages))
    blocked = blocked_tasks(tasks)
    runnable = [t for t in tasks if "actions" in t and task_name(t) not in blocked]
    default = default_tasks(runnable, {spec.name for spec in stages if spec.extra})
    tasks.append(smoke_task(project, profile, default, blocked, dodo))
    report = report_task(project, profile, default)  # an extra rung's receipt is read when present
    tasks.append(report)
    tasks.append(verify_task(project, profile, stages))  # `doit profile=P verify`: never part of plain `doit`
    namespace["DOIT_CONFIG"] = {**doit_config(project, profile),
                                "default_tasks": [task_name(t) for t in (*default, report)]}

    def task_ladder():
        """the align stage ladder"""
        yield from tasks

    namespace["task_ladder"] = task_ladder


def default_tasks(runnable: Sequence[dict], extra: set[str]) -> list[dict]:
    """What plain `doit` builds: every runnable task but the extra rungs' and those that read an extra rung's
    output (`golden_eval:control` evaluates the extra `control_checkpoint`), to a fixpoint: doit would otherwise
    build the extra rung as the dependency of a default task."""
    left = [t for t in runnable if t["basename"] not in extra]
    made = {p for t in runnable if t["basename"] in extra for p in t.get("targets", ())}
    while True:
        keep = [t for t in left if not made.intersection(t.get("file_dep", ()))]
        if len(keep) == len(left):
            return keep
        made.update(p for t in left if t not in keep for p in t.get("targets", ()))
        left = keep
