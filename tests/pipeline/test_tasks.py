"""pipeline.tasks / pipeline.stage: what doit receives for each declaration (no doit run needed)."""

from pathlib import Path

import pytest

from pipeline.launcher import execute
from pipeline.layout import Layout, Project
from pipeline.stage import LADDER, StageSpec, discover, order_stages
from pipeline.tasks import blocked_tasks, doit_config, ladder_tasks


@pytest.fixture
def project(tmp_path):
    (tmp_path / "configs" / "p").mkdir(parents=True)
    (tmp_path / "configs" / "p" / "common.toml").write_text("[run]\nworld_size = 2\n")
    (tmp_path / "configs" / "p" / "shards-sft.toml").write_text("[x]\na = 1\n")
    pkg = tmp_path / "toypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "w.py").write_text("")
    return Project(root=tmp_path, packages=("toypkg",), python="/usr/bin/python3")


def _spec(**kw):
    base = dict(name="shards", doc="tokenise", worker="toypkg.w", config="shards-{variant}.toml",
                targets=lambda ctx: [ctx.run_dir / "manifest.json"])
    return StageSpec(**{**base, **kw})


def test_variants_become_subtasks_with_their_own_run_dirs(project):
    spec = _spec(variants=lambda layout: ["sft", "eval"], args=lambda ctx: [f"x.split={ctx.variant}"],
                 file_dep=lambda ctx: [ctx.stage_dir("ingest", "math") / "manifest.json"])
    tasks = list(ladder_tasks(project, "p", [spec]))
    # the group task's doc: the stage's doc and its worker's file (`doit list` leads to the rung's code)
    assert tasks[0] == {"basename": "shards", "name": None, "doc": "tokenise  [toypkg/w.py]"}
    sft, ev = tasks[1], tasks[2]
    runs = project.root / "runs" / "p"
    assert (sft["basename"], sft["name"], ev["name"]) == ("shards", "sft", "eval")
    assert sft["targets"] == [str(runs / "shards/sft/manifest.json"), str(runs / "receipts/shards-sft.json")]
    assert sft["file_dep"] == [str(runs / "ingest/math/manifest.json")]
    launch = sft["actions"][0][1][0]
    assert launch.argv == ("/usr/bin/python3", "-m", "toypkg.w", "--config", "configs/p/shards-sft.toml",
                           "x.split=sft")  # not distributed: no torchrun although world_size = 2
    assert launch.problem is None and 'a = 1' in launch.config
    assert "config file not found" in ev["actions"][0][1][0].problem  # shards-eval.toml does not exist


def test_distributed_stage_runs_under_torchrun(project):
    spec = _spec(config="shards-sft.toml", distributed=True)
    launch = next(iter(ladder_tasks(project, "p", [spec])))["actions"][0][1][0]
    assert launch.argv[:5] == ("/usr/bin/python3", "-m", "torch.distributed.run", "--standalone",
                               "--nproc-per-node=2")
    assert launch.argv[5:] == ("-m", "toypkg.w", "--config", "configs/p/shards-sft.toml")


def test_problems_are_reported_by_the_action_not_at_listing(project, capsys):
    (project.root / "configs" / "p" / "common.toml").write_text("[run]\nworld_sise = 2\n")
    spec = _spec(config="shards-sft.toml", worker="toypkg.missing")
    launch = next(iter(ladder_tasks(project, "p", [spec])))["actions"][0][1][0]
    assert "unknown key 'world_sise'" in launch.problem
    failed = execute(launch)
    assert "world_sise" in str(failed) and "align: " in capsys.readouterr().err
    (project.root / "configs" / "p" / "common.toml").write_text("")
    launch = next(iter(ladder_tasks(project, "p", [spec])))["actions"][0][1][0]
    assert "worker module toypkg.missing not found" in launch.problem


def test_ladder_order_and_declaration_errors():
    a, b = _spec(name="ingest"), _spec(name="sft_checkpoint")
    assert [s.name for s in order_stages([b, a])] == ["ingest", "sft_checkpoint"]
    with pytest.raises(ValueError, match="not on the ladder"):
        order_stages([_spec(name="pretrain")])
    with pytest.raises(ValueError, match="declared twice"):
        order_stages([a, a])
    assert [s.name for s in discover()] == [n for n in LADDER if n in {s.name for s in discover()}]


def test_doit_config_keeps_state_under_runs(project):
    cfg = doit_config(project, "p")
    assert cfg["backend"] == "sqlite3" and cfg["check_file_uptodate"] == "md5"
    assert Path(cfg["dep_file"]) == Layout(project, "p").runs / ".doit.sqlite3"


def test_optional_stage_without_its_config_has_no_task(project):
    spec = _spec(name="onpolicy_pairs", config="onpolicy_pairs.toml", optional=True)
    assert list(ladder_tasks(project, "p", [spec])) == []
    (project.root / "configs" / "p" / "onpolicy_pairs.toml").write_text("")
    assert [t["basename"] for t in ladder_tasks(project, "p", [spec])] == ["onpolicy_pairs"]


def test_blocked_tasks_follow_producers_listed_later(tmp_path):
    """shards:preference reads onpolicy_pairs/out, whose stage comes later in ladder order: not blocked."""
    def task(name, deps, targets):
        return {"basename": name, "actions": [], "file_dep": [str(tmp_path / d) for d in deps],
                "targets": [str(tmp_path / t) for t in targets]}
    (tmp_path / "raw").write_text("")
    tasks = [task("shards", ["onpolicy/m"], ["shards/m"]), task("sft", ["raw"], ["sft/m"]),
             task("onpolicy", ["sft/m"], ["onpolicy/m"]), task("dpo", ["shards/m", "nowhere/m"], ["dpo/m"])]
    assert blocked_tasks(tasks) == {"dpo": str(tmp_path / "nowhere/m")}
    assert blocked_tasks(tasks[:3] + [task("dpo", ["shards/m"], ["dpo/m"])]) == {}
    assert blocked_tasks([task("a", ["b/m"], ["a/m"]), task("b", ["a/m"], ["b/m"])]) == {
        "a": str(tmp_path / "b/m"), "b": str(tmp_path / "a/m")}  # a cycle is never runnable
