"""The `report` task: one page summing up a profile's ladder from its receipts and training histories.

    doit report                              # builds the ladder first (the receipts are its inputs), then the page
    python -m pipeline.report --profile tiny # renders whatever exists now, without building anything

Writes `runs/<profile>/report/report.txt` (always: the accuracy table per rung and the wall time per task) and,
when matplotlib is installed (the optional `report` extra), `report.html`: the same tables plus the loss and
reward curves of the training rungs and the accuracy per rung, as PNGs inlined in the page (self-contained: one
file to open or attach). matplotlib is imported only when rendering, never when doit loads its tasks."""

from __future__ import annotations

import argparse
import base64
import html
import io
import json
import math
from pathlib import Path
from typing import Sequence

from doit.tools import config_changed

from align.utils.fsio import atomic_write_text
from align.utils.tracking import read_history
from pipeline.layout import Layout, Project

REPORT = "report"
RUNGS = ("sft", "dpo", "grpo")
INLOOP = ("eval/accuracy", "eval/nll")  # align.eval.inloop's columns (NaN between evaluations)
# align.train.moe_module's router telemetry: only an MoE policy's history has them, so a dense ladder draws none
MOE = ("moe/lb_loss", "moe/max_vio", "moe/frac_dead", "moe/router_entropy")
CURVES = {  # training rung -> history columns worth a curve (those present are drawn), ladder order
    "pretrain_checkpoint": ("loss", "heldout_nll", *MOE),
    "sft_checkpoint": ("loss", *INLOOP, *MOE),
    "dpo_checkpoint": ("loss", "rewards/margin", "rewards/accuracy", *INLOOP, *MOE),
    "rm_checkpoint": ("loss", "rewards/accuracy", "rewards/margin"),
    "grpo_checkpoint": ("loss", "reward_mean", *INLOOP, *MOE),
    "ppo_checkpoint": ("loss", "reward_mean", "value_loss", "explained_variance", *INLOOP, *MOE),
}


def _matplotlib_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def report_task(project: Project, profile: str, runnable: Sequence[dict]) -> dict:
    """`runnable`: the ladder's default task dicts (no extra rung) that can run; their receipts are the report's
    inputs. The page also sums up every other receipt present (an extra rung built by name)."""
    from pipeline.tasks import task_name

    layout = Layout(project, profile)
    receipts = [layout.receipt(task_name(t)) for t in runnable]
    return {
        "basename": REPORT,
        "doc": "one page of the ladder: accuracy per rung, loss/reward curves -> runs/<profile>/report/",
        "actions": [(_action, [layout])],
        "file_dep": [str(p) for p in receipts],
        "targets": [str(layout.runs / REPORT / "report.txt")],
        "uptodate": [config_changed({"matplotlib": _matplotlib_available()})],
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
    acc = [["rung", "accuracy", *(f"pass@{k}" for k in ks), "format", "mean len", "truncated", "golden"]]
    for row in accuracy_rows(receipts):
        acc.append([row["rung"], _num(row.get("accuracy")),
                    *(_num(row.get("pass_at_k", {}).get(k)) for k in ks), _num(row.get("format_rate"), "{:.2f}"),
                    _num(row.get("mean_length"), "{:.1f}"), _num(row.get("truncation_rate"), "{:.2f}"),
                    (row.get("golden") or {}).get("status", "-")])
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


# ------------------------------------------------------------------------------------------------------ rendering


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def figures(layout: Layout, receipts: list[dict]) -> list[tuple[str, str]]:
    """[(title, base64 PNG)]: one figure per training rung (a panel per curve), then accuracy per rung."""
    import matplotlib

    matplotlib.use("Agg")  # no display: render to memory
    import matplotlib.pyplot as plt

    out = []
    for stage, series in curves(layout).items():
        fig, axes = plt.subplots(1, len(series), figsize=(4.2 * len(series), 3.0), squeeze=False)
        for ax, (column, points) in zip(axes[0], series.items()):
            ax.plot([s for s, _ in points], [v for _, v in points], lw=1.2)
            ax.set_title(column), ax.set_xlabel("step"), ax.grid(alpha=0.3)
        out.append((stage, _png(fig)))
        plt.close(fig)
    rows = accuracy_rows(receipts)
    if rows:
        fig, ax = plt.subplots(figsize=(5.0, 3.0))
        ax.bar([r["rung"] for r in rows], [r.get("accuracy") or 0.0 for r in rows], color="#4a7ab5")
        ax.set_ylim(0, 1), ax.set_ylabel("greedy accuracy (held-out)"), ax.grid(axis="y", alpha=0.3)
        out.append(("accuracy per rung", _png(fig)))
        plt.close(fig)
    return out


def _html_table(rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows[1:])
    return f"<table><tr>{head}</tr>{body}</table>"


def html_page(profile: str, acc: list[list[str]], timing: list[list[str]], figs: list[tuple[str, str]]) -> str:
    imgs = "".join(f"<h3>{html.escape(t)}</h3><img src='data:image/png;base64,{b}'>" for t, b in figs)
    style = "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #bbb;" \
            "padding:3px 8px;text-align:right}th{background:#eee}"
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>align ladder: {html.escape(profile)}</title>"
            f"<style>{style}</style></head><body><h1>align ladder: profile {html.escape(profile)}</h1>"
            f"<h2>Accuracy per rung</h2>{_html_table(acc)}<h2>Curves</h2>{imgs or '<p>no histories</p>'}"
            f"<h2>Wall time per task</h2>{_html_table(timing)}</body></html>\n")


def render(layout: Layout) -> list[Path]:
    """Write report.txt (and report.html with matplotlib); returns the files written."""
    receipts = _receipts(layout)
    acc, timing = tables(receipts)
    out_dir = layout.runs / REPORT
    out_dir.mkdir(parents=True, exist_ok=True)
    text = f"align ladder, profile {layout.profile}\n\n{text_table(acc)}\n\n"
    levels = level_table(receipts)
    text += f"{text_table(levels)}\n\n" if levels else ""
    extra = [line for line in (grpo_gain_line(receipts), *inloop_lines(layout), *moe_lines(layout)) if line]
    text += "\n".join(extra) + "\n\n" if extra else ""
    text += f"{text_table(timing)}\n"
    written = []
    if _matplotlib_available():
        atomic_write_text(out_dir / "report.html", html_page(layout.profile, acc, timing, figures(layout, receipts)))
        written.append(out_dir / "report.html")
    else:
        text += "\n(install the `report` extra, matplotlib, for report.html with the curves)\n"
    atomic_write_text(out_dir / "report.txt", text)  # last: the task's target
    print(text, end="")
    return [*written, out_dir / "report.txt"]


def _action(layout: Layout) -> None:
    render(layout)  # doit's python-action contract: return None (or a dict), not render's list of paths


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.report", description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="tiny")
    ns = parser.parse_args(argv)
    for path in render(Layout(Project(), ns.profile)):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
