"""`verify`: every published artifact of a profile against its manifest, as `dvc status` does for its outputs.

    python -m pipeline.verify --profile smoke            # one line per artifact: intact / modified / missing
    python -m pipeline.verify --profile smoke --repair   # remove what is modified, so doit rebuilds its producer
    doit profile=smoke verify                            # the same check as a doit task (never up to date)

An artifact is a directory a stage publishes with its `manifest.json` (a task's target), or one of a training
stage's `checkpoints/step_<N>/`. Each file is checked for presence, size and sha256 through the stat cache (an
unchanged file costs a stat). Exit 2 when anything is modified, else 0 (a missing artifact is one not built yet).

`--repair` is the documented way back from a modified artifact, never a silent one: it deletes the modified
directory and its producing task's receipt (both are targets of that task, so the next `doit` rebuilds it and,
through the new manifest, everything downstream). A modified `step_<N>` checkpoint is deleted alone: the stage
then resumes from the newest intact one. `doit profile=P forget TASK` followed by `doit profile=P TASK` also rebuilds
a task, but its worker may reuse a modified output whose key still matches (the reference cache does): delete it."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from doit.exceptions import TaskFailed

from align.exit_codes import BAD_INPUT
from align.utils.manifest import MANIFEST, file_problems
from pipeline import exitcode
from pipeline.launcher import stat_cache_dir
from pipeline.layout import Layout, Project, relative_to_root
from pipeline.profiles import check_profile
from pipeline.stage import StageSpec, discover

INTACT, MODIFIED, MISSING = "intact", "modified", "missing"
VERIFY = "verify"


@dataclass(frozen=True)
class Artifact:
    task: str
    path: Path  # the artifact directory (holds manifest.json)
    receipt: Path
    checkpoint: bool = False  # a training checkpoint `step_<N>` (not a task target)


@dataclass(frozen=True)
class Status:
    artifact: Artifact
    state: str
    detail: str = ""


def artifacts(layout: Layout, stages: Sequence[StageSpec]) -> list[Artifact]:
    """Every artifact the profile's declared stages publish, in ladder order (pure path arithmetic)."""
    found = []
    for spec in stages:
        for ctx in spec.contexts(layout):
            for target in spec.targets(ctx):
                if Path(target).name == MANIFEST:
                    found.append(Artifact(ctx.task, Path(target).parent, ctx.receipt))
            steps = sorted((int(p.name[5:]), p) for p in (ctx.run_dir / "checkpoints").glob("step_*")
                           if p.name[5:].isdigit() and p.is_dir())
            found.extend(Artifact(ctx.task, p, ctx.receipt, checkpoint=True) for _, p in steps)
    return found


def check(artifact: Artifact, cache_dir: Path | None, profile: str) -> Status:
    path = artifact.path / MANIFEST
    if not path.is_file():
        return Status(artifact, MISSING)
    try:
        manifest = json.loads(path.read_text())
        problems = list(file_problems(artifact.path, manifest, cache_dir=cache_dir, profile=profile))
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        problems = [f"{path}: unreadable manifest ({type(exc).__name__}: {exc})"]
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        return Status(artifact, MODIFIED, problems[0] + more)
    return Status(artifact, INTACT)


def verify_profile(project: Project, profile: str, stages: Sequence[StageSpec] | None = None) -> list[Status]:
    layout = Layout(project, profile)
    stages = list(stages) if stages is not None else discover()
    cache = stat_cache_dir(layout.runs)
    return [check(a, cache, profile) for a in artifacts(layout, stages)]


def repair(statuses: Sequence[Status], root: Path, say=print) -> list[str]:
    """Delete every modified artifact (and its task's receipt); returns the tasks doit will rebuild."""
    tasks = []
    for status in statuses:
        if status.state != MODIFIED:
            continue
        art = status.artifact
        shutil.rmtree(art.path)
        say(f"repair: removed {relative_to_root(art.path, root)}")
        if not art.checkpoint and art.receipt.is_file():
            art.receipt.unlink()
            say(f"repair: removed {relative_to_root(art.receipt, root)}")
        if art.task not in tasks:
            tasks.append(art.task)
    return tasks


def report(statuses: Sequence[Status], root: Path, say=print) -> None:
    width = max((len(s.artifact.task) for s in statuses), default=4)
    for s in statuses:
        line = f"{s.state:<9}{s.artifact.task:<{width + 2}}{relative_to_root(s.artifact.path, root)}"
        say(line + (f"\n         {s.detail}" if s.detail else ""))
    counts = {state: sum(s.state == state for s in statuses) for state in (INTACT, MODIFIED, MISSING)}
    say(f"verify: {counts[INTACT]} intact, {counts[MODIFIED]} modified, {counts[MISSING]} missing")


def run(project: Project, profile: str, do_repair: bool = False, stages: Sequence[StageSpec] | None = None,
        say=print) -> int:
    statuses = verify_profile(project, profile, stages)
    report(statuses, project.root, say)
    if not any(s.state == MODIFIED for s in statuses):
        return 0
    if not do_repair:
        say(f"verify: modified artifacts are never used (their consumers refuse them, exit 2); "
            f"`python -m pipeline.verify --profile {profile} --repair` removes them, then `doit profile={profile}` "
            "rebuilds them")
        return BAD_INPUT
    tasks = repair(statuses, project.root, say)
    say(f"verify: run `doit profile={profile} {' '.join(tasks)}` (or plain `doit profile={profile}`) to rebuild")
    return 0


def verify_task(project: Project, profile: str, stages: Sequence[StageSpec]) -> dict:
    """`doit profile=P verify`: the check as a task that is never up to date (it reads the artifacts, not doit's
    database); exit 2 when something is modified."""
    def action():
        code = run(project, profile, stages=stages)
        if code:
            exitcode.record(code)
            return TaskFailed("verify: modified artifacts (listed above)")
        return None

    return {"basename": VERIFY, "doc": "every published artifact against its manifest: intact / modified / missing",
            "actions": [(action, [])], "uptodate": [False], "verbosity": 2}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.verify", description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="tiny")
    parser.add_argument("--repair", action="store_true", help="remove modified artifacts so doit rebuilds them")
    args = parser.parse_args(argv)
    project = Project()
    try:
        check_profile(project, args.profile)
    except ValueError as exc:
        print(f"align: {exc}", file=sys.stderr)
        return BAD_INPUT
    return run(project, args.profile, do_repair=args.repair)


if __name__ == "__main__":
    raise SystemExit(main())
