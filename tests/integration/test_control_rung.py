"""The no-RL control rung (pipeline/stages/control.py): more SFT from the DPO checkpoint, run by the SFT worker on
configs/<profile>/control.toml, evaluated by `golden_eval:control`; both extra, so plain doit (bash scripts/main.sh)
never builds them. The fast checks read the task declarations of a private copy of the project; the slow one builds
the smoke ladder, then the control by name, and compares the two with bench/norl_control.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from align.config import load_config, read_toml
from align.stages.sft import SftStageConfig
from ladder_project import REPO, doit, make_project
from pipeline.frame import default_tasks, install
from pipeline.layout import Project


def _tasks(root: Path, profile: str) -> tuple[dict[str, dict], list[str]]:
    ns = {"__file__": str(root / "dodo.py")}
    install(ns, project=Project(root=root), profile=profile)
    tasks = {(f"{t['basename']}:{t['name']}" if t.get("name") else t["basename"]): t for t in ns["task_ladder"]()}
    return tasks, ns["DOIT_CONFIG"]["default_tasks"]


def test_default_tasks_leave_out_what_reads_an_extra_rungs_output_to_a_fixpoint():
    def task(name, deps=(), targets=()):
        return {"basename": name, "file_dep": list(deps), "targets": list(targets)}

    tasks = [task("sft", targets=["s"]), task("side", ["s"], ["x"]), task("eval_side", ["x"], ["e"]),
             task("summary", ["e", "s"], ["r"]), task("eval_sft", ["s"], ["q"])]
    assert [t["basename"] for t in default_tasks(tasks, {"side"})] == ["sft", "eval_sft"]
    assert [t["basename"] for t in default_tasks(tasks, set())] == [t["basename"] for t in tasks]


@pytest.fixture(scope="module")
def smoke_copy(tmp_path_factory):
    return make_project(tmp_path_factory.mktemp("control"))


def test_the_control_and_its_eval_are_tasks_that_plain_doit_leaves_out(smoke_copy):
    tasks, default = _tasks(smoke_copy, "smoke")
    assert {"control_checkpoint", "golden_eval:control"} <= set(tasks)
    assert "control_checkpoint" not in default and "golden_eval:control" not in default
    assert {"grpo_checkpoint", "golden_eval:grpo", "golden_eval:sft"} <= set(default)
    runs = smoke_copy / "runs" / "smoke"
    control = tasks["control_checkpoint"]
    assert str(runs / "dpo_checkpoint/final/manifest.json") in control["file_dep"]  # where GRPO starts
    assert str(runs / "shards/sft/out/manifest.json") in control["file_dep"]  # the SFT rung's data
    launch = control["actions"][0][1][0]
    assert launch.argv[1:] == ("-m", "align.stages.sft", "--config", "configs/smoke/control.toml")
    evaluation = tasks["golden_eval:control"]
    assert str(runs / "control_checkpoint/final/manifest.json") in evaluation["file_dep"]
    assert evaluation["actions"][0][1][0].argv[-2:] == ("stage=control", "checkpoints.control=control_checkpoint/final")


def test_without_control_toml_there_is_no_control_and_the_default_ladder_is_the_same(smoke_copy, tmp_path):
    root = make_project(tmp_path)
    with_control = _tasks(root, "smoke")[1]
    (root / "configs/smoke/control.toml").unlink()
    tasks, default = _tasks(root, "smoke")
    assert not {"control_checkpoint", "golden_eval:control"} & set(tasks)
    assert default == with_control


@pytest.mark.parametrize("profile", ["smoke", "tiny"])
def test_control_toml_continues_the_sft_recipe_from_grpos_start(profile):
    configs = REPO / "configs" / profile
    control = load_config(configs / "control.toml", SftStageConfig)
    sft = load_config(configs / "sft.toml", SftStageConfig)
    start = read_toml(configs / "grpo.toml").get("data", {}).get("start", "dpo_checkpoint/final")
    assert control.model.base == f"runs/{profile}/{start}"
    assert control.data == sft.data and control.loader == sft.loader and control.loss == sft.loss
    assert control.tokenizer == sft.tokenizer and control.inloop_eval == sft.inloop_eval
    assert control.optimizer.name == sft.optimizer.name and control.optimizer.betas == sft.optimizer.betas
    assert control.optimizer.lr < sft.optimizer.lr  # continued training: a fraction of SFT's peak
    assert control.lora is None and control.train.max_steps > 0


@pytest.mark.slow
def test_control_builds_by_name_records_cpu_seconds_and_compares_with_grpo(tmp_path):
    root = make_project(tmp_path)
    first = doit(root)
    assert first.returncode == 0, first.output[-4000:]
    assert "grpo_checkpoint" in first.ran and not {"control_checkpoint", "golden_eval:control"} & set(first.ran)
    second = doit(root, "control_checkpoint", "golden_eval:control")
    assert second.returncode == 0, second.output[-4000:]
    assert second.ran == ["control_checkpoint", "golden_eval:control"]  # nothing of the ladder reruns

    receipts = root / "runs/smoke/receipts"
    control = json.loads((receipts / "control_checkpoint.json").read_text())
    grpo = json.loads((receipts / "grpo_checkpoint.json").read_text())
    assert control["metrics"]["steps"] == 4 and control["cpu_s"] > 0 and grpo["cpu_s"] > 0
    assert "runs/smoke/dpo_checkpoint/final/manifest.json" in control["inputs"]
    log = (root / "runs/smoke/control_checkpoint/worker.log").read_text()
    assert "step 1/4" in log and "step 4/4" in log
    evaluation = json.loads((receipts / "golden_eval-control.json").read_text())["metrics"]
    assert evaluation["stage"] == "control" and 0.0 <= evaluation["accuracy"] <= 1.0

    proc = subprocess.run([sys.executable, str(REPO / "bench/norl_control.py"), "--profile", "smoke", "--root",
                           str(root)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["control"]["accuracy"] == pytest.approx(evaluation["accuracy"])
    assert out["cpu_ratio"] == pytest.approx(control["cpu_s"] / grpo["cpu_s"], rel=1e-3)
    assert out["gain"]["rows"] == evaluation["examples"] - evaluation["gold_unusable"]
