"""Turn stage declarations into doit task dicts, in ladder order. Task creation only builds metadata (doit's advice):
paths, hashes of code and config; nothing runs until doit calls an action."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, Sequence

from doit.exceptions import InvalidDodoFile
from doit.tools import config_changed

from align.exceptions import AlignInputError
from pipeline import launcher
from pipeline.hashing import code_digest
from pipeline.layout import Layout, Project
from pipeline.profiles import check_profile, load_common
from pipeline.stage import StageSpec


def doit_config(project: Project, profile: str) -> dict:
    """DOIT_CONFIG for a profile: md5 checker, sqlite3 database under runs/<profile>/, ladder order in `doit list`."""
    layout = Layout(project, profile)
    return {
        "backend": "sqlite3",  # transactional; the json backend is rewritten non-atomically (doit#119)
        "dep_file": str(layout.db_file),
        "check_file_uptodate": "md5",  # content, not mtime: touching a file reruns nothing
        "sort": "definition",
        "verbosity": 2,  # stream worker output as it comes
    }


def prepare_runs(project: Project, profile: str) -> None:
    """doit opens its database before any task runs; its directory must exist."""
    Layout(project, profile).runs.mkdir(parents=True, exist_ok=True)


def ladder_tasks(project: Project, profile: str, stages: Sequence[StageSpec]) -> Iterator[dict]:
    """One doit task per stage (per variant for stages with variants), in the order given."""
    try:
        check_profile(project, profile)
    except ValueError as exc:
        raise InvalidDodoFile(str(exc)) from None  # doit prints one line and exits 3
    layout = Layout(project, profile)
    common, common_problem = None, None
    try:
        common = load_common(layout)
    except AlignInputError as exc:
        common_problem = str(exc)  # reported when a task runs, so `doit list` still works
    for spec in stages:
        ctxs = spec.contexts(layout)
        if spec.variants is not None:
            yield {"basename": spec.name, "name": None, "doc": spec.listing}
        digest = code_digest(project.root, spec.code_modules(), project.packages)  # one per stage, not per variant
        for ctx in ctxs:
            plan = launcher.plan(spec, ctx, project, digest, common, common_problem)
            yield _task(spec, plan, variant=ctx.variant)


def _task(spec: StageSpec, plan: launcher.Launch, variant: str | None) -> dict:
    task = {
        "basename": spec.name,
        "doc": spec.listing,
        "actions": [(launcher.execute, [plan])],
        "file_dep": [str(p) for p in plan.file_dep],
        "targets": [str(p) for p in (*plan.targets, plan.receipt)],
        "uptodate": [config_changed(plan.identity())],
    }
    if variant is not None:
        task["name"] = variant
    return task


def task_name(task: dict) -> str:
    return f"{task['basename']}:{task['name']}" if task.get("name") else task["basename"]


def blocked_tasks(tasks: Sequence[dict]) -> dict[str, str]:
    """{task: missing input} for tasks that cannot run because an input neither exists nor is produced by a runnable
    task (its producing stage is not declared yet). Passes until nothing changes: a producer may come later in
    ladder order (`shards:<split>` of `onpolicy_pairs/out` is listed before the stage that publishes it)."""
    pending = [t for t in tasks if "actions" in t]  # skips the doc-only group task of a stage with variants
    deps = {dep for t in pending for dep in t.get("file_dep", ())}
    available = {dep for dep in deps if Path(dep).exists()}  # one stat per input, not one per pass
    while True:
        ready = [all(dep in available for dep in t.get("file_dep", ())) for t in pending]
        if not any(ready):
            break
        for task, ok in zip(pending, ready):
            if ok:
                available.update(task.get("targets", ()))
        pending = [t for t, ok in zip(pending, ready) if not ok]
    return {task_name(t): next(dep for dep in t.get("file_dep", ()) if dep not in available) for t in pending}
