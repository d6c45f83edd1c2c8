"""pipeline/report.py: the ladder's page from receipts and histories (text always, HTML with matplotlib)."""

from __future__ import annotations

import json

import pytest

from pipeline import report
from pipeline.layout import Layout, Project


@pytest.fixture
def layout(tmp_path):
    layout = Layout(Project(root=tmp_path), "tiny")
    layout.receipts.mkdir(parents=True)
    for i, (stage, acc) in enumerate([("sft", 0.31), ("grpo", 0.42), ("dpo", 0.35)]):
        metrics = {"accuracy": acc, "pass_at_k": {"1": acc - 0.1, "4": acc + 0.2}, "format_rate": 0.9,
                   "mean_length": 30.5, "truncation_rate": 0.02, "golden": {"status": "match"}}
        (layout.receipts / f"golden_eval-{stage}.json").write_text(json.dumps(
            {"task": f"golden_eval:{stage}", "metrics": metrics, "wall_s": 10.0 + i, "finished": f"2026-01-0{i + 1}"}))
    (layout.receipts / "sft_checkpoint.json").write_text(json.dumps(
        {"task": "sft_checkpoint", "metrics": {}, "wall_s": 99.0, "finished": "2025-12-31"}))
    history = layout.stage_dir("sft_checkpoint") / "history.jsonl"
    history.parent.mkdir(parents=True)
    history.write_text("".join(json.dumps({"step": s, "loss": 5.0 - s}) + "\n" for s in range(1, 5)))
    return layout


def test_text_report_lists_rungs_in_ladder_order_and_tasks_in_build_order(layout, monkeypatch):
    monkeypatch.setattr(report, "_matplotlib_available", lambda: False)
    written = report.render(layout)
    assert [p.name for p in written] == ["report.txt"]
    text = written[0].read_text()
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("rung"))
    assert lines[header].split() == ["rung", "accuracy", "pass@1", "pass@4", "format", "mean", "len", "truncated",
                                     "golden"]
    assert [line.split()[:2] for line in lines[header + 2: header + 5]] == [["sft", "0.310"], ["dpo", "0.350"],
                                                                             ["grpo", "0.420"]]
    assert text.index("sft_checkpoint    99.0") < text.index("golden_eval:sft ")
    assert "install the `report` extra" in text


def test_curves_read_the_training_histories(layout):
    assert report.curves(layout) == {"sft_checkpoint": {"loss": [(1, 4.0), (2, 3.0), (3, 2.0), (4, 1.0)]}}


def test_html_report_is_self_contained(layout):
    pytest.importorskip("matplotlib")
    written = report.render(layout)
    page = (layout.runs / "report" / "report.html").read_text()
    assert written[0].name == "report.html" and page.count("data:image/png;base64,") == 2  # sft curves + accuracy
    assert "<td>grpo</td><td>0.420</td>" in page and "src='http" not in page


def test_the_report_action_keeps_doits_contract(layout, monkeypatch):
    monkeypatch.setattr(report, "_matplotlib_available", lambda: False)
    spec = report.report_task(layout.project, layout.profile, [])
    func, args = spec["actions"][0]
    assert func(*args) is None  # doit fails a python-action that returns anything but None/True/str/dict
    assert spec["targets"] == [str(layout.runs / "report" / "report.txt")]
    assert (layout.runs / "report" / "report.txt").is_file()


def test_an_moe_rungs_router_telemetry_is_drawn_and_summed_up(layout, monkeypatch):
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
    monkeypatch.setattr(report, "_matplotlib_available", lambda: False)
    text = report.render(layout)[0].read_text()
    assert "dpo_checkpoint moe at step 3: lb_loss 1.062, max_vio 0.25, frac_dead 0.125" in text
    assert "sft_checkpoint moe" not in text
