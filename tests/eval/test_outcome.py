"""The outcome verdict (align.eval.outcome) through the real golden_eval worker on a real small checkpoint: the
held-out accuracy against the profile's `[outcome.<rung>]` band reads expected / regression / improvement /
unrecorded in the receipt, in the printed summary beside the golden verdict and in the report; a bad band is bad
input naming its key."""

from __future__ import annotations

import re

import pytest

from align.config import load_config
from align.exceptions import ConfigError
from align.stages.golden_eval import GoldenEvalStageConfig
from golden_eval_project import run_golden_eval
from pipeline import report
from pipeline.layout import Layout, Project
from pipeline.receipts import read_metrics, write_receipt

BASE = """
[checkpoints]
sft = "sft_checkpoint/final"
dpo = "dpo_checkpoint/final"

[data]
threads = 1

[greedy]
max_new_tokens = 24

[sampled]
n = 1
ks = [1]
max_new_tokens = 24
max_examples = 2

[golden]
prompts = 2
max_new_tokens = 24
"""
SOURCE = "2 test runs, this file"


@pytest.fixture(scope="module")
def project(eval_project):
    return eval_project


def _eval(root, outcome: str) -> tuple[int, dict, str]:
    """(exit code, metrics.json, what the worker printed) of golden_eval:sft under BASE plus `outcome`."""
    config = root / "configs" / "smoke" / "golden_eval.toml"
    config.write_text(BASE + outcome)
    return run_golden_eval(root, config, "sft")


def _band(lo: float, hi: float, groups: str = "") -> str:
    return f'\n[outcome.sft]\naccuracy = [{lo}, {hi}]\nsource = "{SOURCE}"\n{groups}'


@pytest.mark.parametrize("band,verdict,said", [
    (_band(0.4, 0.6), "expected", "accuracy 0.500 within the recorded band 0.400-0.600"),
    (_band(0.5, 0.5), "expected", "accuracy 0.500 within the recorded band 0.500-0.500"),  # bounds are inside
    (_band(0.6, 0.9), "regression", "accuracy 0.500 below the recorded band 0.600-0.900"),
    (_band(0.2, 0.45), "improvement", "accuracy 0.500 above the recorded band 0.200-0.450"),
])
def test_the_accuracy_against_the_recorded_band(project, band, verdict, said):
    code, m, printed = _eval(project, band)
    assert code == 0 and m["accuracy"] == pytest.approx(0.5)
    assert m["outcome"] == {"verdict": verdict, "accuracy": pytest.approx(0.5), "band": [float(v) for v in
                            band.split("[")[2].split("]")[0].split(", ")], "source": SOURCE, "groups": {}}
    summary = next(line for line in printed.splitlines() if line.startswith("golden_eval:sft:"))
    # one line: the golden verdict and the outcome, with the numbers and where the band comes from
    assert summary.endswith(f"; golden not_configured; outcome: {verdict}: {said} ({SOURCE})")


def test_a_rung_without_a_band_is_unrecorded(project):
    code, m, printed = _eval(project, _band(0.4, 0.6).replace("outcome.sft", "outcome.dpo"))  # another rung's band
    assert code == 0 and m["outcome"] == {"verdict": "unrecorded", "accuracy": pytest.approx(0.5), "band": None,
                                          "source": None, "groups": {}}
    assert ("golden not_configured; outcome: unrecorded: accuracy 0.500; no recorded band for sft ([outcome.sft] "
            "in golden_eval.toml)") in printed


def test_a_level_below_its_band_is_a_regression_the_total_hides(project):
    groups = 'groups = { "1" = [0.4, 0.6], "2" = [0.6, 1.0], "3" = [0.0, 0.4], "9" = [0.0, 1.0] }\n'
    code, m, printed = _eval(project, _band(0.4, 0.6, groups))
    assert code == 0 and m["accuracy_by_group"] == {"1": 0.5, "2": 0.5, "3": 0.5}
    detail = {g: d["verdict"] for g, d in m["outcome"]["groups"].items()}
    assert detail == {"1": "expected", "2": "regression", "3": "improvement", "9": "not_evaluated"}
    assert m["outcome"]["verdict"] == "regression"  # inside overall, yet level 2 fell below its band
    assert m["outcome"]["groups"]["2"] == {"accuracy": 0.5, "band": [0.6, 1.0], "verdict": "regression"}
    assert (f"outcome: regression: accuracy 0.500 within the recorded band 0.400-0.600, level 2 0.500 below "
            f"0.600-1.000, level 3 0.500 above 0.000-0.400, level 9 not evaluated ({SOURCE})") in printed


def test_a_level_above_its_band_and_none_below_is_an_improvement(project):
    code, m, _ = _eval(project, _band(0.4, 0.6, 'groups = { "3" = [0.1, 0.3] }\n'))
    assert code == 0 and m["outcome"]["verdict"] == "improvement"


@pytest.mark.parametrize("outcome,said", [
    (_band(0.6, 0.4), "[outcome.sft] accuracy = [0.6, 0.4]: expected [lo, hi] with 0 <= lo <= hi <= 1"),
    (_band(0.4, 1.2), "[outcome.sft] accuracy = [0.4, 1.2]: expected [lo, hi] with 0 <= lo <= hi <= 1"),
    ('\n[outcome.sft]\naccuracy = [0.4, 0.5, 0.6]\nsource = "x"\n', "[outcome.sft] accuracy = [0.4, 0.5, 0.6]"),
    (_band(0.4, 0.6, 'groups = { "2" = [-0.1, 0.5] }\n'), "[outcome.sft] groups.2 = [-0.1, 0.5]: expected [lo"),
    ('\n[outcome.sft]\naccuracy = [0.4, 0.6]\nsource = " "\n', "[outcome.sft] source is empty: name the runs"),
    ('\n[outcome.sft]\naccuracy = [0.4, 0.6]\n', "[outcome.sft] missing required key 'source'"),
    ('\n[outcome.sft]\naccuracy = ["a", 0.6]\nsource = "x"\n', "outcome.sft.accuracy[0]: expected float"),
    ('\n[outcome.sft]\naccuracy = [0.4, 0.6]\nsource = "x"\nlevels = {}\n', "[outcome.sft] unknown key 'levels'"),
    (_band(0.4, 0.6).replace("outcome.sft", "outcome.ppo"),
     "[<top>] outcome.ppo: 'ppo' is not a key of [checkpoints] (known: sft, dpo)"),
])
def test_a_bad_band_is_bad_input_naming_its_key(project, outcome, said):
    config = project / "configs" / "smoke" / "bad.toml"
    config.write_text(BASE + outcome)
    with pytest.raises(ConfigError) as err:
        load_config(config, GoldenEvalStageConfig)
    assert said in str(err.value) and str(config) in str(err.value)


def test_the_worker_refuses_a_bad_band_before_evaluating(project):
    code, _, printed = _eval(project, _band(0.6, 0.4))
    assert code == 2 and "[outcome.sft] accuracy = [0.6, 0.4]: expected [lo, hi]" in printed


def test_the_report_shows_both_verdicts_from_the_workers_receipt(project):
    """The receipt as the launcher writes it (the worker's metrics.json) -> report.txt and report.html."""
    code, _, _ = _eval(project, _band(0.6, 0.9, 'groups = { "2" = [0.6, 1.0] }\n'))
    assert code == 0
    layout = Layout(Project(root=project), "smoke")
    run_dir = layout.stage_dir("golden_eval", "sft")
    write_receipt(layout.receipt("golden_eval:sft"), task="golden_eval:sft", profile="smoke", root=project,
                  inputs=[], outputs=[run_dir / "out" / "manifest.json"], code_digest="", config_digest="",
                  config="", metrics=read_metrics(run_dir), wall_s=1.0)
    html, txt = report.render(layout)
    assert (f"sft: golden not_configured; outcome: regression: accuracy 0.500 below the recorded band 0.600-0.900, "
            f"level 2 0.500 below 0.600-1.000 ({SOURCE})") in txt.read_text().splitlines()
    page = html.read_text()
    assert "<tr><td>sft</td><td>0.500</td><td class='v-regression'>regression</td>" \
           "<td class='v-not_configured'>not_configured</td>" in page
    bars = re.findall(r"data-series='sft' data-category='([^']+)' data-value='([\d.]+)'", page)
    assert bars == [("all", "0.5000"), ("level 1", "0.5000"), ("level 2", "0.5000"), ("level 3", "0.5000")]
    assert re.findall(r"<title>(sft, [^<]*recorded band [^<]*)</title>", page) == [
        "sft, all: recorded band 0.600-0.900", "sft, level 2: recorded band 0.600-1.000"]
