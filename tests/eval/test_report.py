"""pipeline/report.py: the ladder's page from receipts and histories: report.txt and a self-contained report.html
whose charts are inline SVG (pipeline/report_svg.py, standard library only)."""

from __future__ import annotations

import json
import os
import random
import re
import xml.etree.ElementTree as ET

import pytest

from align.eval.outcome import OutcomeBand, verdict
from pipeline import report, report_svg
from pipeline.layout import Layout, Project

SVG = "{http://www.w3.org/2000/svg}"
# each rung's accuracy per level and the outcome verdict its band gives (align.eval.outcome, the worker's function)
RUNGS = [("sft", 0.31, {"1": 0.5, "2": 0.12}, OutcomeBand((0.25, 0.35), "3 seeds x 2 ISAs, abc1234")),
         ("grpo", 0.42, {"1": 0.6, "2": 0.24}, OutcomeBand((0.5, 0.6), "3 seeds x 2 ISAs, abc1234",
                                                            {"2": (0.3, 0.4)})),
         ("dpo", 0.35, {"1": 0.55, "2": 0.15}, None)]


@pytest.fixture
def layout(tmp_path):
    layout = Layout(Project(root=tmp_path), "tiny")
    layout.receipts.mkdir(parents=True)
    for i, (stage, acc, levels, band) in enumerate(RUNGS):
        metrics = {"accuracy": acc, "pass_at_k": {"1": acc - 0.1, "4": acc + 0.2}, "format_rate": 0.9,
                   "mean_length": 30.5, "truncation_rate": 0.02, "accuracy_by_group": levels,
                   "golden": {"status": "match" if stage == "sft" else "checkpoint_changed"},
                   "outcome": verdict(band, acc, levels)}
        (layout.receipts / f"golden_eval-{stage}.json").write_text(json.dumps(
            {"task": f"golden_eval:{stage}", "metrics": metrics, "wall_s": 10.0 + i, "finished": f"2026-01-0{i + 1}"}))
    (layout.receipts / "sft_checkpoint.json").write_text(json.dumps(
        {"task": "sft_checkpoint", "metrics": {}, "wall_s": 99.0, "finished": "2025-12-31"}))
    history = layout.stage_dir("sft_checkpoint") / "history.jsonl"
    history.parent.mkdir(parents=True)
    history.write_text("".join(json.dumps({"step": s, "loss": 5.0 - s}) + "\n" for s in range(1, 5)))
    return layout


def test_text_report_lists_rungs_in_ladder_order_and_tasks_in_build_order(layout):
    written = report.render(layout)
    assert [p.name for p in written] == ["report.html", "report.txt"]
    text = written[1].read_text()
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("rung"))
    assert lines[header].split() == ["rung", "accuracy", "pass@1", "pass@4", "format", "mean", "len", "truncated",
                                     "golden", "outcome"]
    assert [line.split()[:2] + line.split()[-2:] for line in lines[header + 2: header + 5]] == [
        ["sft", "0.310", "match", "expected"], ["dpo", "0.350", "checkpoint_changed", "unrecorded"],
        ["grpo", "0.420", "checkpoint_changed", "regression"]]
    # both verdicts, with the numbers, one line per rung
    assert ("grpo: golden checkpoint_changed; outcome: regression: accuracy 0.420 below the recorded band "
            "0.500-0.600, level 2 0.240 below 0.300-0.400 (3 seeds x 2 ISAs, abc1234)") in lines
    assert "sft: golden match; outcome: expected: accuracy 0.310 within the recorded band 0.250-0.350 (3 seeds x 2 " \
           "ISAs, abc1234)" in lines
    assert text.index("sft_checkpoint    99.0") < text.index("golden_eval:sft ")


def test_curves_read_the_training_histories(layout):
    assert report.curves(layout) == {"sft_checkpoint": {"loss": [(1, 4.0), (2, 3.0), (3, 2.0), (4, 1.0)]}}


def _svgs(page: str) -> list[ET.Element]:
    """Every inline chart, parsed as XML (a malformed one raises)."""
    return [ET.fromstring(m) for m in re.findall(r"<svg .*?</svg>", page, re.S)]


def test_html_report_is_self_contained_svg_with_level_bars_and_verdicts(layout):
    report.render(layout)
    page = (layout.runs / "report" / "report.html").read_text()
    assert "src=" not in page and "href=" not in page and "<script" not in page and "<img" not in page
    charts = _svgs(page)
    assert [c.get("aria-label") for c in charts] == ["held-out greedy accuracy per rung and level", "loss"]
    bars = {(r.get("data-series"), r.get("data-category")): float(r.get("data-value"))
            for r in charts[0].iter(f"{SVG}rect") if r.get("data-series")}
    assert bars == {(rung, cat): pytest.approx(v) for rung, acc, levels, _ in RUNGS
                    for cat, v in [("all", acc), *((f"level {g}", a) for g, a in levels.items())]}
    brackets = [p for p in charts[0].iter(f"{SVG}path") if p.get("class") == "band"]
    assert sorted(b.find(f"{SVG}title").text for b in brackets) == [
        "grpo, all: recorded band 0.500-0.600", "grpo, level 2: recorded band 0.300-0.400",
        "sft, all: recorded band 0.250-0.350"]
    verdicts = re.findall(r"<tr><td>(\w+)</td><td>([\d.]+)</td><td class='v-(\w+)'>\w+</td>"
                          r"<td class='v-(\w+)'>\w+</td>", page)
    assert verdicts == [("sft", "0.310", "expected", "match"), ("dpo", "0.350", "unrecorded", "checkpoint_changed"),
                        ("grpo", "0.420", "regression", "checkpoint_changed")]
    assert "regression: accuracy 0.420 below the recorded band 0.500-0.600, level 2 0.240 below" in page


def test_a_noisy_curve_gets_its_ema_and_a_smooth_one_does_not(layout):
    rng = random.Random(0)
    rows = [{"step": s, "loss": 5.0 - s / 100, "reward_mean": 0.3 + s / 400 + rng.uniform(-0.2, 0.2),
             "eval/accuracy": s / 250 if s % 50 == 0 else float("nan")} for s in range(1, 201)]
    history = layout.stage_dir("grpo_checkpoint") / "history.jsonl"
    history.parent.mkdir(parents=True)
    history.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report.render(layout)
    svgs = _svgs((layout.runs / "report" / "report.html").read_text())
    assert [c.get("aria-label") for c in svgs[1:]] == ["loss", "loss", "reward_mean", "eval/accuracy"]  # sft, grpo
    charts = {c.get("aria-label"): c for c in svgs[2:]}  # grpo's
    ema = [p for p in charts["reward_mean"].iter(f"{SVG}polyline") if p.get("class") == "ema"]
    assert len(ema) == 1 and len(ema[0].get("points").split()) == 200  # every step, over the faint raw line
    for smooth in ("loss", "eval/accuracy"):  # a straight loss, four in-loop evaluations: drawn as they are
        assert not [p for p in charts[smooth].iter(f"{SVG}polyline") if p.get("class") == "ema"]
    assert len(list(charts["eval/accuracy"].iter(f"{SVG}circle"))) == 4


def test_the_ema_is_pandas_adjusted_ewm():
    pd = pytest.importorskip("pandas")
    rng = random.Random(1)
    values = [rng.gauss(0, 1) + i / 50 for i in range(300)]
    span = report_svg.span_for(len(values))
    want = pd.Series(values).ewm(span=span, adjust=True).mean().tolist()
    assert report_svg.ema(values, span) == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_charts_stay_well_formed_on_odd_values():
    for points in ([(1, 0.0)], [(1, 2.0), (2, 2.0)], [(0, -1e-5), (5, 3e4)], [(s, (-1) ** s) for s in range(50)]):
        ET.fromstring(report_svg.line_chart("a <b> & 'c'", points))
    chart = ET.fromstring(report_svg.bar_chart("x", ["all", "level <1>"], [("s&ft", [0.5, None]), ("b", [0.0, 1.0])],
                                               {("s&ft", "all"): [0.4, 0.6]}))
    assert {(r.get("data-series"), r.get("data-category")) for r in chart.iter(f"{SVG}rect")
            if r.get("data-series")} == {("s&ft", "all"), ("b", "all"), ("b", "level <1>")}


def test_nice_ticks_cover_the_range_in_round_steps():
    assert report_svg.nice_ticks(0.13, 0.87) == pytest.approx([0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    assert report_svg.nice_ticks(1, 960, 4) == pytest.approx([0, 500, 1000])
    ticks = report_svg.nice_ticks(-3.2, 41.0)
    assert ticks[0] <= -3.2 and ticks[-1] >= 41.0


def test_the_report_action_keeps_doits_contract(layout):
    spec = report.report_task(layout.project, layout.profile, [])
    func, args = spec["actions"][0]
    assert func(*args) is None  # doit fails a python-action that returns anything but None/True/str/dict
    assert spec["targets"] == [str(layout.runs / "report" / "report.html"), str(layout.runs / "report" / "report.txt")]
    assert all(os.path.isfile(t) for t in spec["targets"])


def test_where_line_names_the_page_or_says_none_was_rendered(layout):
    assert report.where_line(layout) == (f"report: none rendered yet under {layout.runs.resolve()} "
                                         f"(doit profile=tiny report)")
    report.render(layout)
    assert report.where_line(layout) == f"report: {(layout.runs / 'report' / 'report.html').resolve()}"


def test_an_moe_rungs_router_telemetry_is_drawn_and_summed_up(layout):
    """An OLMoE policy's history carries align.train.moe_module's columns (NaN before the first window): the report
    draws them beside the loss and prints their last values; a dense rung (sft here) gets no moe line."""
    nan = float("nan")
    rows = [{"step": 1, "loss": 2.0, "moe/lb_loss": nan, "moe/max_vio": nan},
            {"step": 2, "loss": 1.5, "moe/lb_loss": 1.25, "moe/max_vio": 0.5, "moe/frac_dead": 0.0},
            {"step": 3, "loss": 1.0, "moe/lb_loss": 1.0625, "moe/max_vio": 0.25, "moe/frac_dead": 0.125}]
    history = layout.stage_dir("dpo_checkpoint") / "history.jsonl"
    history.parent.mkdir(parents=True)
    history.write_text("".join(json.dumps(r) + "\n" for r in rows))
    series = report.curves(layout)["dpo_checkpoint"]
    assert series["moe/lb_loss"] == [(2, 1.25), (3, 1.0625)] and series["moe/frac_dead"] == [(2, 0.0), (3, 0.125)]
    text = report.render(layout)[1].read_text()
    assert "dpo_checkpoint moe at step 3: lb_loss 1.062, max_vio 0.25, frac_dead 0.125" in text
    assert "sft_checkpoint moe" not in text
