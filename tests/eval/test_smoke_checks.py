"""pipeline/smoke_checks.py: what `doit smoke` requires of the smoke ladder's receipts."""

from __future__ import annotations

from pathlib import Path

from pipeline.layout import Layout, Project
from pipeline.smoke_checks import SmokeChecks, load_checks, verify

REPO = Path(__file__).resolve().parents[2]
CHECKS = SmokeChecks(rungs=("sft_checkpoint", "dpo_checkpoint", "golden_eval"), evals=("sft", "dpo"), golden=True)


def _eval(accuracy=0.4, pass_at_k=None, golden=None):
    golden = golden or {"status": "match", "passed": True}
    return {"metrics": {"accuracy": accuracy, "pass_at_k": pass_at_k or {"1": 0.3, "4": 0.6}, "golden": golden}}


def _tasks(**evals):
    tasks = {"sft_checkpoint": {"metrics": {}}, "dpo_checkpoint": {"metrics": {}}}
    tasks.update({f"golden_eval:{k}": v for k, v in {"sft": _eval(), "dpo": _eval(), **evals}.items()})
    return tasks


def test_a_complete_ladder_with_matching_goldens_passes():
    assert verify(CHECKS, _tasks(), [], {}, "smoke") == []


def test_missing_blocked_and_unbuilt_rungs_are_named():
    tasks = _tasks()
    del tasks["dpo_checkpoint"], tasks["golden_eval:dpo"]
    problems = verify(CHECKS, tasks, ["grpo_checkpoint"], {"golden_eval:grpo": "runs/x/manifest.json"}, "smoke")
    assert problems == ["golden_eval:grpo cannot run: its input runs/x/manifest.json is produced by no declared stage",
                        "stage dpo_checkpoint has no receipt",
                        "golden_eval:dpo: no receipt (is dpo a key of [checkpoints] in golden_eval.toml?)"]
    undeclared = SmokeChecks(rungs=("grpo_checkpoint",))
    assert verify(undeclared, {}, ["grpo_checkpoint"], {}, "smoke") == [
        "stage grpo_checkpoint is not declared (no pipeline/stages/ file)"]


def test_accuracy_and_pass_at_k_must_be_fractions():
    tasks = _tasks(sft=_eval(accuracy=None), dpo=_eval(accuracy=True, pass_at_k={"4": 1.5}))
    problems = verify(CHECKS, tasks, [], {}, "smoke")
    assert problems[0] == "golden_eval:sft: metrics.accuracy is None, expected a number in [0, 1]"
    assert problems[1].startswith("golden_eval:dpo: metrics.accuracy is True")
    assert problems[2].startswith("golden_eval:dpo: metrics.pass_at_k is {'4': 1.5}")


def test_a_failed_golden_regression_shows_the_diff_and_the_accept_command():
    golden = {"status": "checkpoint_changed", "passed": False, "differing": 2, "prompts": 8,
              "first_diff": {"id": "eval-3", "diff": "-4 + 5 = 9\n+4 + 5 = 8"}, "anchor": "configs/smoke/golden/dpo.json"}
    [problem] = verify(CHECKS, _tasks(dpo=_eval(golden=golden)), [], {}, "smoke")
    assert problem.startswith("golden_eval:dpo: golden regression checkpoint_changed (2 of 8 differ; first eval-3:")
    assert "+4 + 5 = 8" in problem
    assert "python -m align.eval.golden accept --profile smoke --stage dpo, then commit configs/smoke/golden/dpo.json" \
        in problem
    assert verify(SmokeChecks(evals=("dpo",), golden=False), _tasks(dpo=_eval(golden=golden)), [], {}, "s") == []


def test_checks_come_from_the_profile_and_a_bad_file_is_one_line(tmp_path):
    assert load_checks(Layout(Project(root=tmp_path), "smoke")) == SmokeChecks()  # no smoke.toml: summary only
    real = load_checks(Layout(Project(root=REPO), "smoke"))
    assert real.evals == ("sft", "dpo", "grpo") and real.golden and "grpo_checkpoint" in real.rungs
    (tmp_path / "configs/smoke").mkdir(parents=True)
    (tmp_path / "configs/smoke/smoke.toml").write_text("[checks]\ngoldn = true\n")
    assert "unknown key(s) ['goldn'] in [checks]" in load_checks(Layout(Project(root=tmp_path), "smoke"))
