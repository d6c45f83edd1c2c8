"""The `report` task: one page summing up a profile's ladder from its receipts and training histories.

    doit                                     # builds the ladder; the report is its last default task
    doit report                              # the same: the receipts are its inputs
    python -m pipeline.report --profile tiny # renders whatever exists now, without building anything
    python -m pipeline.report --profile tiny --where   # one line: `report: <path of report.html>`

Writes `runs/<profile>/report/report.html`: the verdict per rung (held-out accuracy, the outcome against the band
recorded for the profile, the golden decode check), accuracy per rung and level as grouped bars, the tables, and
the training curves of every rung, as inline SVG (pipeline/report_svg.py, standard library only; one
self-contained file to open or attach); and `report.txt`, the same tables and verdicts as text (written last: the
task's target). A profile whose rungs are missing renders what exists."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Sequence

from doit.tools import config_changed

from align.eval.outcome import describe
from align.utils.fsio import atomic_write_text, sha256_bytes
from align.utils.tracking import read_history
from pipeline import report_html, report_svg
from pipeline.layout import Layout, Project

REPORT = "report"
RUNGS = ("sft", "dpo", "grpo")
INLOOP = ("eval/accuracy", "eval/nll")  # align.eval.inloop's columns (NaN between evaluations)
# align.train.moe_module's router telemetry: only an MoE policy's history has them, so a dense ladder draws none
MOE = ("moe/lb_loss", "moe/max_vio", "moe/frac_dead", "moe/router_entropy")
TOOL = "rollout/tool_call_rate"  # align.rl.env_eval: only a run with an [environment] has it
CURVES = {  # training rung -> history columns worth a curve (those present are drawn), ladder order
    "pretrain_checkpoint": ("loss", "heldout_nll", *MOE),
    "sft_checkpoint": ("loss", *INLOOP, *MOE),
    "dpo_checkpoint": ("loss", "rewards/margin", "rewards/accuracy", *INLOOP, *MOE),
    "rm_checkpoint": ("loss", "rewards/accuracy", "rewards/margin"),
    "grpo_checkpoint": ("loss", "reward_mean", TOOL, *INLOOP, *MOE),
    "control_checkpoint": ("loss", *INLOOP, *MOE),  # the no-RL control (extra): more SFT for GRPO's CPU seconds
    "ppo_checkpoint": ("loss", "reward_mean", "value_loss", "explained_variance", TOOL, *INLOOP, *MOE),
}


def _code_digest() -> str:
    """The rendering code: a new version re-renders a page whose receipts did not change."""
    files = (__file__, report_html.__file__, report_svg.__file__, sys.modules[describe.__module__].__file__)
    return sha256_bytes(b"".join(Path(f).read_bytes() for f in files))


def report_task(project: Project, profile: str, runnable: Sequence[dict]) -> dict:
    """`runnable`: the ladder's default task dicts (no extra rung) that can run; their receipts are the report's
    inputs, so plain `doit` renders it after every rung. The page also sums up every other receipt present (an
    extra rung built by name)."""
    from pipeline.tasks import task_name

    layout = Layout(project, profile)
    receipts = [layout.receipt(task_name(t)) for t in runnable]
    return {
        "basename": REPORT,
        "doc": "one page of the ladder: verdicts and accuracy per rung and level, curves -> runs/<profile>/report/",
        "actions": [(_action, [layout])],
        "file_dep": [str(p) for p in receipts],
        "targets": [str(html_path(layout)), str(layout.runs / REPORT / "report.txt")],
        "uptodate": [config_changed({"code": _code_digest()})],
    }


# ------------------------------------------------------------------------------------------------------ content


def _receipts(layout: Layout) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(layout.receipts.glob("*.json"))]


def accuracy_rows(receipts: list[dict]) -> list[dict]:
    evals = {r["task"].partition(":")[2]: r["metrics"] for r in receipts if r["task"].startswith("golden_eval:")}
    order = [s for s in RUNGS if s in evals] + sorted(s for s in evals if s not in RUNGS)
    return [{"rung": s, **evals[s]} for s in order]


def _num(value, fmt: str = "{:.3f}") -> str:
    return fmt.format(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def tables(receipts: list[dict]) -> tuple[list[list[str]], list[list[str]]]:
    """(accuracy table, timing table), header row first."""
    ks = sorted({k for row in accuracy_rows(receipts) for k in row.get("pass_at_k", {})}, key=int)
    acc = [["rung", "accuracy", *(f"pass@{k}" for k in ks), "format", "mean len", "truncated", "golden", "outcome"]]
    for row in accuracy_rows(receipts):
        acc.append([row["rung"], _num(row.get("accuracy")),
                    *(_num(row.get("pass_at_k", {}).get(k)) for k in ks), _num(row.get("format_rate"), "{:.2f}"),
                    _num(row.get("mean_length"), "{:.1f}"), _num(row.get("truncation_rate"), "{:.2f}"),
                    (row.get("golden") or {}).get("status", "-"), (_outcome(row) or {}).get("verdict", "-")])
    timing = [["task", "wall s", "finished"]]
    stages = sorted((r for r in receipts if r.get("finished")), key=lambda r: r["finished"])  # build order
    timing += [[r["task"], _num(r.get("wall_s"), "{:.1f}"), r["finished"]] for r in stages]
    return acc, timing


def level_table(receipts: list[dict]) -> list[list[str]]:
    """Greedy accuracy per difficulty level (the eval set's group column) and rung, header row first."""
    rows = accuracy_rows(receipts)
    levels = sorted({g for r in rows for g in r.get("accuracy_by_group", {})}, key=lambda g: (len(g), g))
    out = [["rung", *(f"level {g}" for g in levels), "all"]]
    out += [[r["rung"], *(_num(r.get("accuracy_by_group", {}).get(g)) for g in levels), _num(r.get("accuracy"))]
            for r in rows]
    return out if levels else []


def inloop_lines(layout: Layout) -> list[str]:
    """One line per training rung: the in-loop held-out accuracy / NLL at each evaluated step."""
    lines = []
    for stage, series in curves(layout).items():
        acc, nll = dict(series.get(INLOOP[0], [])), dict(series.get(INLOOP[1], []))
        if acc:
            points = ", ".join(f"{step}: {a:.3f}/{nll.get(step, math.nan):.3f}" for step, a in sorted(acc.items()))
            lines.append(f"{stage} (step: accuracy/nll) {points}")
    return lines


def moe_lines(layout: Layout) -> list[str]:
    """One line per MoE training rung: its router telemetry at the last step that logged it."""
    lines = []
    for stage, series in curves(layout).items():
        last = {c: series[c][-1] for c in MOE if c in series}
        if last:
            step = max(s for s, _ in last.values())
            lines.append(f"{stage} moe at step {step}: " + ", ".join(f"{c[4:]} {v:.4g}" for c, (_, v) in last.items()))
    return lines


def grpo_gain_line(receipts: list[dict]) -> str | None:
    m = next((r["metrics"] for r in receipts if r["task"] == "grpo_checkpoint"), None)
    if not m or "accuracy_gain_ci95" not in m:
        return None
    lo, hi = m["accuracy_gain_ci95"]
    return (f"grpo held-out gain {m['accuracy_gain']:+.3f} (95% CI {lo:+.3f} .. {hi:+.3f}, paired SE "
            f"{m['accuracy_gain_se']:.3f}, {m['heldout_rows']} problems: {m['rows_gained']} gained, "
            f"{m['rows_lost']} lost)")


def text_table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def curves(layout: Layout) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """{stage: {column: [(step, value)]}} from each training rung's history.jsonl."""
    out = {}
    for stage, columns in CURVES.items():
        rows = read_history(layout.stage_dir(stage) / "history.jsonl")
        found = {c: [(r["step"], r[c]) for r in rows if _finite(r.get(c))] for c in columns}
        if any(found.values()):
            out[stage] = {c: v for c, v in found.items() if v}
    return out


# ------------------------------------------------------------------------------------------------------ verdicts


def _outcome(row: dict) -> dict | None:
    return row.get("outcome") if isinstance(row.get("outcome"), dict) else None  # absent: an older receipt


def verdict_rows(receipts: list[dict]) -> list[list[str]]:
    """Per rung: held-out accuracy, the outcome verdict, the golden verdict and the outcome's sentence (with the
    band and where it comes from), header row first."""
    out = [["rung", "accuracy", "outcome", "golden", "detail"]]
    for row in accuracy_rows(receipts):
        outcome = _outcome(row)
        out.append([row["rung"], _num(row.get("accuracy")), outcome["verdict"] if outcome else "-",
                    (row.get("golden") or {}).get("status", "-"),
                    describe(outcome, row["rung"]).removeprefix("outcome: ") if outcome else "-"])
    return out


def level_bars(receipts: list[dict]) -> tuple[list[str], list[tuple[str, list[float | None]]], dict]:
    """bar_chart's (categories, series, bands): "all" then each level; one series per rung; each recorded band."""
    rows = accuracy_rows(receipts)
    levels = sorted({g for r in rows for g in r.get("accuracy_by_group", {})}, key=lambda g: (len(g), g))
    categories = ["all", *(f"level {g}" for g in levels)]
    series, bands = [], {}
    for r in rows:
        values = [r.get("accuracy"), *(r.get("accuracy_by_group", {}).get(g) for g in levels)]
        series.append((r["rung"], [v if _finite(v) else None for v in values]))
        outcome = _outcome(r)
        if outcome and outcome.get("band"):
            bands[(r["rung"], "all")] = outcome["band"]
            bands |= {(r["rung"], f"level {g}"): d["band"] for g, d in outcome.get("groups", {}).items()}
    return categories, series, bands


# ------------------------------------------------------------------------------------------------------ rendering


def html_path(layout: Layout) -> Path:
    return layout.runs / REPORT / "report.html"


def where_line(layout: Layout) -> str:
    """What `bash scripts/main.sh` prints last: the page's absolute path, or that none was rendered."""
    path = html_path(layout)
    if path.is_file():
        return f"report: {path.resolve()}"
    return f"report: none rendered yet under {layout.runs.resolve()} (doit profile={layout.profile} report)"


def render(layout: Layout) -> list[Path]:
    """Write report.html and report.txt (last); returns the files written."""
    receipts = _receipts(layout)
    acc, timing = tables(receipts)
    verdicts = verdict_rows(receipts)
    out_dir = layout.runs / REPORT
    out_dir.mkdir(parents=True, exist_ok=True)
    text = f"align ladder, profile {layout.profile}\n\n{text_table(acc)}\n\n"
    said = [f"{r[0]}: golden {r[3]}; outcome: {r[4]}" for r in verdicts[1:] if r[2] != "-"]
    text += "\n".join(said) + "\n\n" if said else ""
    levels = level_table(receipts)
    text += f"{text_table(levels)}\n\n" if levels else ""
    notes = [line for line in (grpo_gain_line(receipts), *inloop_lines(layout), *moe_lines(layout)) if line]
    text += "\n".join(notes) + "\n\n" if notes else ""
    text += f"{text_table(timing)}\n"
    data = report_html.PageData(profile=layout.profile, verdicts=verdicts, accuracy=acc,
                                levels=level_bars(receipts), notes=notes, curves=curves(layout), timing=timing)
    atomic_write_text(html_path(layout), report_html.page(data))
    atomic_write_text(out_dir / "report.txt", text)  # last: the task's target
    print(text, end="")
    return [html_path(layout), out_dir / "report.txt"]


def _action(layout: Layout) -> None:
    render(layout)  # doit's python-action contract: return None (or a dict), not render's list of paths


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.report", description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="tiny")
    parser.add_argument("--root", type=Path, default=None, help="project root (default: this checkout)")
    parser.add_argument("--where", action="store_true", help="print where report.html is; render nothing")
    ns = parser.parse_args(argv)
    layout = Layout(Project(root=ns.root) if ns.root else Project(), ns.profile)
    if ns.where:
        print(where_line(layout))
        return 0
    for path in render(layout):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
