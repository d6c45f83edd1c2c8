"""Two rungs' greedy evaluations of the same held-out problems, compared problem by problem.

`greedy_rows` reads what `golden_eval:<rung>` publishes (`out/samples.jsonl`, verified against its manifest first):
row -> (level, right) for every greedy sample whose gold is usable. `paired_comparison` pairs two such evaluations
row by row: each rung's accuracy overall and per level, and the gain of one over the other with the paired standard
error and 95% interval of align.eval.canary.paired_gain (the GRPO receipt's), overall and within each level. The
no-RL control's comparison (bench/norl_control.py) is its first user."""

from __future__ import annotations

import json
from pathlib import Path

from align.eval.canary import paired_gain
from align.exceptions import ArtifactError
from align.utils.manifest import verify_artifact

SAMPLES = "samples.jsonl"


def greedy_rows(out_dir: str | Path) -> dict[int, tuple[str, int]]:
    """{row: (level, 1 right / 0 wrong)} of a golden_eval output's greedy pass; rows with an unusable gold (reward
    None) are left out, as the evaluation's own accuracy leaves them out of its denominator."""
    out_dir = Path(out_dir)
    verify_artifact(out_dir, kind="golden_eval")
    rows: dict[int, tuple[str, int]] = {}
    with open(out_dir / SAMPLES, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            try:
                record = json.loads(line)
                if record["pass"] != "greedy" or record["reward"] is None:
                    continue
                row, level, reward = int(record["row"]), str(record["group"]), float(record["reward"])
            except (ValueError, KeyError, TypeError) as exc:
                raise ArtifactError(f"{out_dir / SAMPLES}: line {number}: not a judged sample ({exc})") from None
            if row in rows:
                raise ArtifactError(f"{out_dir / SAMPLES}: line {number}: row {row} has a second greedy sample")
            rows[row] = (level, int(reward == 1.0))
    return rows


def _accuracy(right: list[int]) -> float:
    return sum(right) / len(right)


def _gain(base: list[int], other: list[int]) -> dict:
    return {"accuracy_gain": _accuracy(other) - _accuracy(base), "rows": len(base),
            **paired_gain({"right": base}, {"right": other})}


def paired_comparison(base: dict[int, tuple[str, int]], other: dict[int, tuple[str, int]]) -> dict:
    """`other` against `base`, paired by row: {"base": {accuracy, accuracy_by_level}, "other": {...},
    "gain": {accuracy_gain, accuracy_gain_se, accuracy_gain_ci95, rows_gained, rows_lost, rows},
    "gain_by_level": {level: the same}}. Both must hold the same rows with the same levels."""
    if set(base) != set(other) or not base:
        only = sorted(set(base) ^ set(other))[:5]
        raise ArtifactError(f"paired_comparison: the two evaluations do not hold the same {len(base)} / "
                            f"{len(other)} problems (rows only in one: {only})")
    rows = sorted(base)
    moved = [r for r in rows if base[r][0] != other[r][0]]
    if moved:
        raise ArtifactError(f"paired_comparison: row {moved[0]} is level {base[moved[0]][0]!r} in one evaluation "
                            f"and {other[moved[0]][0]!r} in the other")
    levels = sorted({base[r][0] for r in rows}, key=lambda g: (len(g), g))
    by_level = {g: [r for r in rows if base[r][0] == g] for g in levels}

    def rung(ev: dict[int, tuple[str, int]]) -> dict:
        return {"accuracy": _accuracy([ev[r][1] for r in rows]),
                "accuracy_by_level": {g: _accuracy([ev[r][1] for r in rs]) for g, rs in by_level.items()}}

    return {"base": rung(base), "other": rung(other),
            "gain": _gain([base[r][1] for r in rows], [other[r][1] for r in rows]),
            "gain_by_level": {g: _gain([base[r][1] for r in rs], [other[r][1] for r in rs])
                              for g, rs in by_level.items()}}
