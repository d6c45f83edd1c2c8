"""The `smoke` task: the whole ladder (whatever stages exist) under profile `smoke`, summed up in one receipt.

Under profile `smoke` it depends on every stage's receipt and writes `runs/smoke/receipts/smoke.json` (each task's
outputs, metrics and code digest, and the ladder stages not declared yet). Under any other profile, `doit smoke`
runs `doit profile=smoke smoke` in a child process: the two profiles have different task sets and databases, and the
child's doit decides what is up to date, so the delegating task itself always runs (it costs one no-op doit)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Sequence

from doit.exceptions import TaskFailed
from doit.tools import config_changed

from align.utils.fsio import atomic_write_json
from pipeline import exitcode
from pipeline.layout import Layout, Project
from pipeline.receipts import read_receipt
from pipeline.smoke_checks import SmokeChecks, load_checks, verify
from pipeline.stage import LADDER, SMOKE
from pipeline.tasks import task_name

SMOKE_PROFILE = "smoke"


def smoke_task(project: Project, profile: str, runnable: Sequence[dict], blocked: dict[str, str],
               dodo: Path) -> dict:
    """`runnable`: the ladder's task dicts that can run; `blocked`: {task: missing input} for those that cannot."""
    doc = "the ladder under profile smoke (what CI runs), summed up in receipts/smoke.json"
    if profile != SMOKE_PROFILE:
        argv = [project.python, "-m", "doit", "-f", str(dodo), f"profile={SMOKE_PROFILE}", SMOKE]
        return {"basename": SMOKE, "doc": doc, "actions": [(_delegate, [argv, project.root])], "uptodate": []}
    layout = Layout(project, profile)
    receipts = [layout.receipt(task_name(t)) for t in runnable]
    declared = {t["basename"] for t in runnable} | {name.split(":")[0] for name in blocked}
    missing = [name for name in LADDER if name not in declared]
    checks = load_checks(layout)  # configs/smoke/smoke.toml: what the receipts must show (pipeline/smoke_checks.py)
    return {
        "basename": SMOKE,
        "doc": doc,
        "actions": [(_summarise, [receipts, layout.receipt(SMOKE), missing, blocked, checks])],
        "file_dep": [str(p) for p in receipts],
        "targets": [str(layout.receipt(SMOKE))],
        "uptodate": [config_changed({"blocked": blocked, "missing": missing,
                                     "checks": checks if isinstance(checks, str) else checks.as_dict()})],
    }


def _delegate(argv: list[str], cwd: Path) -> TaskFailed | None:
    code = subprocess.run(argv, cwd=cwd).returncode
    if code != 0:
        exitcode.record(code)
        return TaskFailed(f"smoke: `{' '.join(argv[1:])}` exited {code}")
    return None


def _summarise(receipts: list[Path], out: Path, missing: list[str], blocked: dict[str, str],
               checks: SmokeChecks | str) -> TaskFailed | None:
    tasks = {}
    for path in receipts:
        r = read_receipt(path)
        tasks[r["task"]] = {"outputs": r["outputs"], "metrics": r["metrics"], "code_digest": r["code_digest"],
                            "wall_s": r["wall_s"]}
    problems = [checks] if isinstance(checks, str) else verify(checks, tasks, missing, blocked, SMOKE_PROFILE)
    atomic_write_json(out, {"task": SMOKE, "profile": SMOKE_PROFILE, "tasks": tasks,
                            "stages_not_declared": missing, "tasks_blocked": blocked, "check_problems": problems,
                            "wall_s": round(sum(t["wall_s"] for t in tasks.values()), 3)})
    if problems:  # the summary is written (it says what failed), but doit records the task as failed
        print("\n".join(f"align: smoke: {p}" for p in problems), file=sys.stderr, flush=True)
        return TaskFailed(f"smoke: {len(problems)} check(s) failed on the receipts")
    return None
