"""report.html: one self-contained page (inline CSS and SVG; no script, no external file) from the report's tables
and series, which pipeline/report.py derives from the receipts and histories.

Top down: the verdict per rung (held-out accuracy, the outcome against the recorded band, the golden decode check),
the accuracy per rung and level as grouped bars, the accuracy table and notes (GRPO's gain, in-loop evaluations,
router telemetry), the training curves of every rung (pipeline/report_svg.py smooths the noisy ones), the wall time
per task."""

from __future__ import annotations

from dataclasses import dataclass, field
from html import escape

from pipeline.report_svg import COLORS, bar_chart, line_chart

STYLE = ("body{font-family:sans-serif;margin:2em;max-width:1200px}table{border-collapse:collapse;margin:.5em 0}"
         "td,th{border:1px solid #bbb;padding:3px 8px;text-align:right}th{background:#eee}td:first-child{"
         "text-align:left}.charts{display:flex;flex-wrap:wrap;gap:8px}.v-expected{background:#d8efd9}"
         ".v-regression,.v-mismatch{background:#f6d3d2}.v-improvement{background:#d6e6f7}.v-match{background:#d8efd9}"
         ".v-unrecorded,.v-checkpoint_changed,.v-no_anchor,.v-prompts_changed,.v-not_configured{background:#f4ecd0}"
         "td.detail{text-align:left;font-size:90%}.note{font-family:monospace;font-size:90%;white-space:pre-wrap}")
VERDICT_COLUMNS = ("outcome", "golden")  # cells of these columns get a class per verdict (colour)


@dataclass(frozen=True)
class PageData:
    """What the page shows; every table is a header row then data rows of strings."""

    profile: str
    verdicts: list[list[str]]
    accuracy: list[list[str]]
    levels: tuple[list[str], list[tuple[str, list[float | None]]], dict] = field(
        default_factory=lambda: ([], [], {}))  # bar_chart's categories, series, bands
    notes: list[str] = field(default_factory=list)
    curves: dict[str, dict[str, list[tuple[int, float]]]] = field(default_factory=dict)
    timing: list[list[str]] = field(default_factory=list)


def html_table(rows: list[list[str]], classed: tuple[str, ...] = (), wide: str = "") -> str:
    """`classed`: header names whose cells get `class='v-<value>'`; `wide`: a header whose cells align left."""
    if not rows:
        return "<p>nothing yet</p>"
    head = "".join(f"<th>{escape(c)}</th>" for c in rows[0])
    body = []
    for row in rows[1:]:
        cells = []
        for name, value in zip(rows[0], row):
            cls = f" class='v-{escape(value)}'" if name in classed else " class='detail'" if name == wide else ""
            cells.append(f"<td{cls}>{escape(value)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _curves(curves: dict[str, dict[str, list[tuple[int, float]]]]) -> str:
    if not curves:
        return "<p>no training histories</p>"
    out = []
    for i, (stage, series) in enumerate(curves.items()):
        charts = "".join(line_chart(column, points, COLORS[i % len(COLORS)]) for column, points in series.items())
        out.append(f"<h3>{escape(stage)}</h3><div class='charts'>{charts}</div>")
    return "".join(out)


def page(data: PageData) -> str:
    categories, series, bands = data.levels
    bars = (bar_chart("held-out greedy accuracy per rung and level", categories, series, bands, "accuracy")
            if categories and series else "<p>no evaluated rung yet</p>")
    notes = "".join(f"<p class='note'>{escape(n)}</p>" for n in data.notes)
    title = f"align ladder: profile {escape(data.profile)}"
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title><style>{STYLE}</style>"
            f"</head><body><h1>{title}</h1>"
            f"<h2>Verdict per rung</h2>{html_table(data.verdicts, VERDICT_COLUMNS, 'detail')}"
            f"<p>outcome: the held-out accuracy against the band recorded for this profile ([outcome] in "
            f"golden_eval.toml); golden: whether the greedy decode equals a recorded checkpoint's, bit for bit.</p>"
            f"<h2>Accuracy per rung and level</h2>{bars}{html_table(data.accuracy, VERDICT_COLUMNS)}{notes}"
            f"<h2>Training curves</h2>{_curves(data.curves)}"
            f"<h2>Wall time per task</h2>{html_table(data.timing)}</body></html>\n")
