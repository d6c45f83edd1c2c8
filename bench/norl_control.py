"""GRPO against its no-RL control (issue 45 item 3): does RL beat more SFT of the same data for the same CPU time?

Reads a profile's receipts and evaluation outputs, builds nothing:
  - `golden_eval:grpo` and `golden_eval:control`: their greedy held-out samples (runs/<profile>/golden_eval/<rung>/
    out/samples.jsonl, verified against the manifest), paired problem by problem (align.eval.paired_rungs): both
    rungs' accuracy overall and per level, the gain GRPO - control with its paired 95% interval, overall and per level;
  - `grpo_checkpoint` and `control_checkpoint`: the CPU seconds their workers spent (the receipt's `cpu_s`) and the
    ratio control / GRPO (1.0: the same compute);
  - `calibration`: the `[train] max_steps` of configs/<profile>/control.toml that spends GRPO's CPU seconds, from
    the SFT rung's CPU seconds per step (`sft_checkpoint`'s receipt) and, once the control ran, from its own.

    bash scripts/main.sh && bash scripts/main.sh control_checkpoint golden_eval:control   # the ladder, the control
    .venv/bin/python bench/norl_control.py --profile tiny        # one JSON line
    .venv/bin/python bench/norl_control.py --profile tiny --calibrate   # only `calibration` (before the control ran)

A missing or inconsistent receipt or output is one line on stderr naming it, exit 2."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from align.eval.paired_rungs import greedy_rows, paired_comparison  # noqa: E402
from align.exceptions import AlignInputError, ArtifactError  # noqa: E402
from pipeline.layout import Layout, Project  # noqa: E402

RL, CONTROL, SFT = "grpo", "control", "sft"


def receipt(layout: Layout, task: str) -> dict:
    path = layout.receipt(task)
    if not path.is_file():
        raise ArtifactError(f"{path}: no receipt of {task} (build it: bash scripts/main.sh {task})")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"{path}: unreadable receipt ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("metrics"), dict):
        raise ArtifactError(f"{path}: not a receipt (no metrics table)")
    return data


def cpu_s(layout: Layout, task: str) -> float:
    value = receipt(layout, task).get("cpu_s")
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise ArtifactError(f"{layout.receipt(task)}: no positive cpu_s (a receipt written before the launcher "
                            f"recorded CPU seconds: rebuild {task})")
    return float(value)


def steps(layout: Layout, task: str) -> int:
    value = receipt(layout, task)["metrics"].get("steps")
    if not isinstance(value, int) or value <= 0:
        raise ArtifactError(f"{layout.receipt(task)}: metrics.steps is {value!r}, expected a positive step count")
    return value


def calibration(layout: Layout, with_control: bool) -> dict:
    """max_steps for the control that spends GRPO's CPU seconds, at SFT's and (once it ran) the control's own CPU
    seconds per step. Beside the control, an SFT receipt without cpu_s (built before receipts had it) only leaves
    its keys out: the control's own cost is the measure then."""
    grpo = cpu_s(layout, "grpo_checkpoint")
    out: dict = {"grpo_cpu_s": grpo}
    try:
        per_step = cpu_s(layout, "sft_checkpoint") / steps(layout, "sft_checkpoint")
        out.update(sft_cpu_s_per_step=round(per_step, 4), max_steps_at_sft_cost=round(grpo / per_step))
    except ArtifactError:
        if not with_control:
            raise
    if with_control:
        own = cpu_s(layout, "control_checkpoint") / steps(layout, "control_checkpoint")
        out.update(control_cpu_s_per_step=round(own, 4), max_steps_at_control_cost=round(grpo / own))
    return out


def evaluated(layout: Layout, rung: str) -> tuple[dict, dict[int, tuple[str, int]]]:
    """(the eval receipt's metrics, its greedy rows), checked to tell the same accuracy."""
    metrics = receipt(layout, f"golden_eval:{rung}")["metrics"]
    rows = greedy_rows(layout.stage_dir("golden_eval", rung) / "out")
    mine = sum(r for _, r in rows.values()) / len(rows) if rows else None
    if mine is None or abs(mine - metrics.get("accuracy", float("nan"))) > 1e-9:
        raise ArtifactError(f"{layout.receipt(f'golden_eval:{rung}')}: accuracy {metrics.get('accuracy')!r}, but "
                            f"its samples.jsonl has {mine!r}: the output is not this receipt's")
    return metrics, rows


def compare(layout: Layout) -> dict:
    rl_metrics, rl_rows = evaluated(layout, RL)
    ctl_metrics, ctl_rows = evaluated(layout, CONTROL)
    if rl_metrics.get("eval_set_hash") != ctl_metrics.get("eval_set_hash"):
        raise ArtifactError(f"{layout.receipt('golden_eval:grpo')} and {layout.receipt('golden_eval:control')}: "
                            "different eval sets (eval_set_hash): rebuild both on the same shards")
    paired = paired_comparison(ctl_rows, rl_rows)  # gain = GRPO - control
    grpo_cpu, ctl_cpu = cpu_s(layout, "grpo_checkpoint"), cpu_s(layout, "control_checkpoint")
    return {"profile": layout.profile,
            "grpo": {**paired["other"], "cpu_s": grpo_cpu, "steps": steps(layout, "grpo_checkpoint")},
            "control": {**paired["base"], "cpu_s": ctl_cpu, "steps": steps(layout, "control_checkpoint")},
            "gain": paired["gain"], "gain_by_level": paired["gain_by_level"],
            "cpu_ratio": round(ctl_cpu / grpo_cpu, 4), "calibration": calibration(layout, with_control=True)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/norl_control.py", description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="tiny")
    parser.add_argument("--root", type=Path, default=REPO, help="the project whose runs/<profile>/ is read")
    parser.add_argument("--calibrate", action="store_true", help="print only the control's max_steps calibration")
    args = parser.parse_args(argv)
    layout = Layout(Project(root=args.root.resolve()), args.profile)
    try:
        result = ({"profile": args.profile, "calibration": calibration(layout, with_control=False)}
                  if args.calibrate else compare(layout))
    except AlignInputError as exc:
        print(f"norl_control: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
