"""bench/norl_control.py on small synthetic receipts of known values: the paired gain GRPO - control and its 95%
interval, overall and per level, equal what numpy computes from the per-problem differences; the CPU seconds, their
ratio and the max_steps calibration come from the receipts; a missing or inconsistent input is one line, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from align.utils.manifest import write_manifest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "norl_control.py"
LEVELS = ("1", "2", "3", "4")
N_PER_LEVEL = 40


def _eval_rung(runs: Path, rung: str, right: np.ndarray, levels: list[str], eval_hash: str = "e" * 64,
               accuracy: float | None = None) -> None:
    out = runs / "golden_eval" / rung / "out"
    out.mkdir(parents=True)
    with open(out / "samples.jsonl", "w") as f:
        for row, (ok, level) in enumerate(zip(right, levels)):
            f.write(json.dumps({"pass": "greedy", "row": row, "id": f"p{row}", "group": level, "sample": 0,
                                "gold": "1", "reward": float(ok)}) + "\n")
            f.write(json.dumps({"pass": "sampled", "row": row, "id": f"p{row}", "group": level, "sample": 0,
                                "gold": "1", "reward": 1.0}) + "\n")  # not the greedy pass: never counted
        f.write(json.dumps({"pass": "greedy", "row": len(right), "id": "bad-gold", "group": "1", "sample": 0,
                            "gold": "?", "reward": None}) + "\n")  # an unusable gold: in no denominator
    write_manifest(out, "golden_eval")
    acc = float(right.mean()) if accuracy is None else accuracy
    _receipt(runs, f"golden_eval:{rung}", {"accuracy": acc, "eval_set_hash": eval_hash})


def _receipt(runs: Path, task: str, metrics: dict, cpu_s: float | None = None) -> None:
    path = runs / "receipts" / (task.replace(":", "-") + ".json")
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"task": task, "metrics": metrics, "wall_s": 1.0, **({"cpu_s": cpu_s} if cpu_s is not None else {})}
    path.write_text(json.dumps(body))


@pytest.fixture
def project(tmp_path):
    rng = np.random.default_rng(7)
    levels = [lv for lv in LEVELS for _ in range(N_PER_LEVEL)]
    p_ctl = np.repeat([0.9, 0.7, 0.4, 0.2], N_PER_LEVEL)
    control = (rng.random(len(levels)) < p_ctl).astype(int)
    grpo = np.where(rng.random(len(levels)) < 0.25, 1 - control, control)  # a quarter of the rows flipped
    grpo[len(levels) - N_PER_LEVEL:] |= (rng.random(N_PER_LEVEL) < 0.3).astype(int)  # level 4 gains more
    runs = tmp_path / "runs" / "toy"
    _eval_rung(runs, "grpo", grpo, levels)
    _eval_rung(runs, "control", control, levels)
    _receipt(runs, "sft_checkpoint", {"steps": 640}, cpu_s=320.0)  # 0.5 CPU s per step
    _receipt(runs, "grpo_checkpoint", {"steps": 160}, cpu_s=600.0)
    _receipt(runs, "control_checkpoint", {"steps": 1200}, cpu_s=660.0)  # 0.55 per step
    return tmp_path, runs, grpo, control, np.array(levels)


def _bench(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH), "--profile", "toy", "--root", str(root), *args],
                          capture_output=True, text=True, timeout=120)


def _expected(grpo: np.ndarray, control: np.ndarray) -> tuple[float, float, float, float]:
    d = (grpo - control).astype(float)
    se = d.std(ddof=1) / np.sqrt(len(d))
    return d.mean(), se, d.mean() - 1.96 * se, d.mean() + 1.96 * se


def test_paired_gain_and_interval_match_numpy_overall_and_per_level(project):
    root, _, grpo, control, levels = project
    proc = _bench(root)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1
    out = json.loads(lines[0])
    assert set(out) == {"profile", "grpo", "control", "gain", "gain_by_level", "cpu_ratio", "calibration"}
    assert set(out["grpo"]) == set(out["control"]) == {"accuracy", "accuracy_by_level", "cpu_s", "steps"}
    assert set(out["gain"]) == {"accuracy_gain", "accuracy_gain_se", "accuracy_gain_ci95", "rows_gained",
                                "rows_lost", "rows"}
    assert out["grpo"]["accuracy"] == pytest.approx(grpo.mean(), abs=1e-12)
    assert out["control"]["accuracy"] == pytest.approx(control.mean(), abs=1e-12)

    mean, se, lo, hi = _expected(grpo, control)
    gain = out["gain"]
    assert gain["rows"] == len(grpo) and abs(mean) > 0.01
    assert gain["accuracy_gain"] == pytest.approx(mean, abs=1e-12)
    assert gain["accuracy_gain_se"] == pytest.approx(se, rel=1e-9)
    assert gain["accuracy_gain_ci95"] == pytest.approx([lo, hi], rel=1e-9)
    assert gain["rows_gained"] == int(((grpo == 1) & (control == 0)).sum())
    assert gain["rows_lost"] == int(((grpo == 0) & (control == 1)).sum())

    assert list(out["gain_by_level"]) == list(LEVELS)
    for level in LEVELS:
        m = levels == level
        mean, se, lo, hi = _expected(grpo[m], control[m])
        got = out["gain_by_level"][level]
        assert got["rows"] == N_PER_LEVEL and got["accuracy_gain"] == pytest.approx(mean, abs=1e-12)
        assert got["accuracy_gain_ci95"] == pytest.approx([lo, hi], rel=1e-9, abs=1e-12)
        assert out["grpo"]["accuracy_by_level"][level] == pytest.approx(grpo[m].mean(), abs=1e-12)
        assert out["control"]["accuracy_by_level"][level] == pytest.approx(control[m].mean(), abs=1e-12)


def test_cpu_seconds_ratio_and_calibration_come_from_the_receipts(project):
    root = project[0]
    out = json.loads(_bench(root).stdout)
    assert (out["grpo"]["cpu_s"], out["control"]["cpu_s"]) == (600.0, 660.0)
    assert (out["grpo"]["steps"], out["control"]["steps"]) == (160, 1200)
    assert out["cpu_ratio"] == pytest.approx(1.1)
    cal = out["calibration"]
    assert cal["sft_cpu_s_per_step"] == 0.5 and cal["max_steps_at_sft_cost"] == 1200  # 600 / 0.5
    assert cal["control_cpu_s_per_step"] == 0.55 and cal["max_steps_at_control_cost"] == 1091  # 600 / 0.55

    only = _bench(root, "--calibrate")
    assert only.returncode == 0, only.stderr
    assert json.loads(only.stdout) == {"profile": "toy", "calibration": {
        "grpo_cpu_s": 600.0, "sft_cpu_s_per_step": 0.5, "max_steps_at_sft_cost": 1200}}


def test_an_sft_receipt_without_cpu_seconds_leaves_the_controls_own_calibration(project):
    root, runs = project[0], project[1]
    _receipt(runs, "sft_checkpoint", {"steps": 640})  # built before receipts carried cpu_s
    out = json.loads(_bench(root).stdout)
    assert out["calibration"] == {"grpo_cpu_s": 600.0, "control_cpu_s_per_step": 0.55,
                                  "max_steps_at_control_cost": 1091}
    proc = _bench(root, "--calibrate")  # before the control ran, SFT's cost is the only measure: required
    assert proc.returncode == 2 and "sft_checkpoint.json: no positive cpu_s" in proc.stderr


def test_missing_receipt_is_one_line_naming_it(project):
    root, runs = project[0], project[1]
    (runs / "receipts" / "golden_eval-control.json").unlink()
    proc = _bench(root)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "golden_eval-control.json: no receipt of golden_eval:control" in proc.stderr


def test_a_receipt_without_cpu_seconds_is_refused(project):
    root, runs = project[0], project[1]
    _receipt(runs, "grpo_checkpoint", {"steps": 160})  # written before receipts carried cpu_s
    proc = _bench(root)
    assert proc.returncode == 2 and "grpo_checkpoint.json: no positive cpu_s" in proc.stderr


def test_evaluations_of_different_problems_or_a_stale_output_are_refused(tmp_path):
    levels = ["1"] * 4
    runs = tmp_path / "runs" / "toy"
    _eval_rung(runs, "grpo", np.array([1, 0, 1, 1]), levels, eval_hash="a" * 64)
    _eval_rung(runs, "control", np.array([1, 0, 0, 1]), levels, eval_hash="b" * 64)
    proc = _bench(tmp_path)
    assert proc.returncode == 2 and "different eval sets" in proc.stderr

    _receipt(runs, "golden_eval:control", {"accuracy": 0.25, "eval_set_hash": "a" * 64})  # not its samples' 0.5
    proc = _bench(tmp_path)
    assert proc.returncode == 2 and "golden_eval-control.json: accuracy 0.25, but its samples.jsonl has 0.5" in proc.stderr

    (runs / "golden_eval" / "control" / "out" / "samples.jsonl").write_text("")  # changed after publication
    proc = _bench(tmp_path)
    assert proc.returncode == 2 and "samples.jsonl" in proc.stderr
