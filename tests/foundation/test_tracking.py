"""align.utils.tracking: JSONL history with fixed columns and torn-line repair; the progress display."""

import io
import json
import math

import pytest

from align.utils.tracking import MetricsHistory, ProgressDisplay, last_step, read_history


def test_history_rows_share_columns(tmp_path):
    path = tmp_path / "history.jsonl"
    h = MetricsHistory(path)
    h.log(1, {"loss": 2.5, "lr": 1e-3})
    h.log(2, {"loss": float("nan")})  # missing lr and a NaN loss are written as null
    with pytest.raises(ValueError, match="'grad_norm' is not a column"):
        h.log(3, {"loss": 1.0, "grad_norm": 0.5})
    rows = read_history(path)
    assert rows == [{"step": 1, "loss": 2.5, "lr": 1e-3}, {"step": 2, "loss": None, "lr": None}]
    assert all(list(r) == ["step", "loss", "lr"] for r in rows)
    assert all(json.loads(line) for line in path.read_text().splitlines())  # strict JSON, no NaN literal


def test_torn_last_line_is_dropped_on_reopen_and_columns_kept(tmp_path):
    path = tmp_path / "history.jsonl"
    MetricsHistory(path).log(1, {"loss": 1.0})
    with open(path, "a") as f:
        f.write('{"step": 2, "lo')  # a writer killed mid-line
    assert last_step(path) == 1
    h = MetricsHistory(path)
    assert h.columns == ("step", "loss")
    h.log(2, {"loss": 0.5})
    assert [r["step"] for r in read_history(path)] == [1, 2]
    h.truncate_after(1)
    assert [r["step"] for r in read_history(path)] == [1]


def test_disabled_history_writes_nothing(tmp_path):
    h = MetricsHistory(tmp_path / "h.jsonl", enabled=False)
    assert h.log(1, {"x": 1}) is None and not (tmp_path / "h.jsonl").exists()


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_progress_plain_lines_when_not_a_terminal():
    clock, out = Clock(), io.StringIO()
    p = ProgressDisplay(10, out, is_tty=False, plain_every_s=5.0, label="sft", clock=clock)
    for step in range(1, 11):
        clock.t = step * 1.0
        p.update(step, tokens=100, loss=1.0 / step)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("sft step 1/10") and lines[-1].startswith("sft step 10/10")
    assert len(lines) == 3  # step 1, step 6 (5 s later), and the final step
    assert "100 tok/s" in lines[-1] and "loss 0.1000" in lines[-1] and "ETA 00:00" in lines[-1]
    assert "\r" not in out.getvalue()


def test_progress_one_redrawn_line_on_a_terminal():
    clock, out = Clock(), io.StringIO()
    p = ProgressDisplay(4, out, is_tty=True, redraw_s=0.0, clock=clock)
    for step in range(1, 5):
        clock.t = step * 2.0
        p.update(step, tokens=10)
    p.close()
    text = out.getvalue()
    assert text.count("\r") == 4 and text.endswith("\n") and text.count("\n") == 1
    assert "ETA 00:06" in text.split("\r")[1]  # after 1 of 4 steps in 2 s: 3 steps x 2 s left


def test_a_fresh_run_over_an_old_history_takes_its_own_columns(tmp_path):
    # a config change that adds a callback (new columns) trains afresh: truncate_after(0) must not keep the old set
    path = tmp_path / "history.jsonl"
    old = MetricsHistory(path)
    old.log(1, {"loss": 1.0})
    fresh = MetricsHistory(path)
    fresh.truncate_after(0)
    fresh.log(1, {"loss": 2.0, "eval/accuracy": 0.5})
    assert read_history(path) == [{"step": 1, "loss": 2.0, "eval/accuracy": 0.5}]
    resumed = MetricsHistory(path)
    resumed.truncate_after(1)  # a resume keeps the rows and their columns
    with pytest.raises(ValueError, match="not a column"):
        resumed.log(2, {"loss": 1.0, "other": 1.0})
