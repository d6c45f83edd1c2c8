"""What `doit smoke` checks on the smoke ladder's receipts, as configured in `configs/smoke/smoke.toml`:

    [checks]
    rungs = ["sft_checkpoint", ...]   every listed stage is declared, not blocked, and has a receipt for each task
    evals = ["sft", "dpo", "grpo"]    each golden_eval:<stage> receipt has metrics.accuracy, a number in [0, 1], and
                                      metrics.pass_at_k, a table of numbers in [0, 1]
    golden = true                     and its golden regression passed (verdict "match")

A profile without smoke.toml is only summed up (a project whose ladder is still a sketch). A failed check fails
the `smoke` task with one line per problem; a golden failure names the verdict, the first differing sample and the
command that accepts new anchors."""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Real

from align.config import ConfigError, read_toml
from pipeline.layout import Layout

CONFIG = "smoke.toml"


@dataclass(frozen=True)
class SmokeChecks:
    rungs: tuple[str, ...] = ()
    evals: tuple[str, ...] = ()
    golden: bool = False

    def as_dict(self) -> dict:
        return {"rungs": list(self.rungs), "evals": list(self.evals), "golden": self.golden}


def load_checks(layout: Layout) -> SmokeChecks | str:
    """The profile's checks (none when it has no smoke.toml), or the problem with the file as a string."""
    path = layout.configs / CONFIG
    if not path.is_file():
        return SmokeChecks()
    try:
        table = read_toml(path).get("checks", {})
        checks = SmokeChecks(tuple(table.get("rungs", ())), tuple(table.get("evals", ())),
                             bool(table.get("golden", False)))
    except (ConfigError, TypeError, AttributeError) as exc:
        return f"{path}: {exc}"
    unknown = set(table) - {"rungs", "evals", "golden"}
    return f"{path}: unknown key(s) {sorted(unknown)} in [checks]" if unknown else checks


def _fraction(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and 0.0 <= value <= 1.0


def _eval_problems(task: str, metrics: dict, golden: bool, profile: str) -> list[str]:
    problems = []
    if not _fraction(metrics.get("accuracy")):
        problems.append(f"{task}: metrics.accuracy is {metrics.get('accuracy')!r}, expected a number in [0, 1]")
    pass_at_k = metrics.get("pass_at_k")
    if not isinstance(pass_at_k, dict) or not pass_at_k or not all(_fraction(v) for v in pass_at_k.values()):
        problems.append(f"{task}: metrics.pass_at_k is {pass_at_k!r}, expected {{k: number in [0, 1]}}")
    verdict = metrics.get("golden") or {}
    if golden and not verdict.get("passed"):
        line = f"{task}: golden regression {verdict.get('status', 'missing')}"
        diff = verdict.get("first_diff")
        if diff:
            line += f" ({verdict.get('differing')} of {verdict.get('prompts')} differ; first {diff['id']}:\n{diff['diff']})"
        stage = task.partition(":")[2]
        problems.append(line + f"\n  if the change is intended: .venv/bin/python -m align.eval.golden accept "
                               f"--profile {profile} --stage {stage}, then commit {verdict.get('anchor', 'it')}")
    return problems


def verify(checks: SmokeChecks, tasks: dict[str, dict], missing: list[str], blocked: dict[str, str],
           profile: str) -> list[str]:
    """`tasks`: {task name: its receipt's summary (metrics, ...)}; returns the problems, [] when all is well."""
    problems = [f"stage {name} is not declared (no pipeline/stages/ file)" for name in checks.rungs
                if name in missing]
    problems += [f"{task} cannot run: its input {dep} is produced by no declared stage"
                 for task, dep in blocked.items() if task.split(":")[0] in checks.rungs]
    built = {name.split(":")[0] for name in tasks}
    problems += [f"stage {name} has no receipt" for name in checks.rungs if name not in built and name not in missing]
    for stage in checks.evals:
        task = f"golden_eval:{stage}"
        if task not in tasks:
            problems.append(f"{task}: no receipt (is {stage} a key of [checkpoints] in golden_eval.toml?)")
            continue
        problems += _eval_problems(task, tasks[task].get("metrics", {}), checks.golden, profile)
    return problems
