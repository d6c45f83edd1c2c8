"""The launcher beyond one machine: [run] nnodes + rdzv_endpoint and $ALIGN_NODE_RANK -> torchrun's c10d
rendezvous flags; bad values are one clear problem; only node 0's launcher writes the task's receipt. (Two torchrun
agents on loopback running the SFT stage: tests/train/test_multinode_stage.py.)"""

from __future__ import annotations

import dataclasses
import sys

import pytest

from align.profile import RunConfig
from pipeline.launcher import execute, torchrun_args
from pipeline.layout import Project
from pipeline.stage import StageSpec
from pipeline.tasks import ladder_tasks

ENDPOINT = "10.0.0.1:29400"


@pytest.fixture
def project(tmp_path):
    (tmp_path / "configs" / "p").mkdir(parents=True)
    (tmp_path / "configs" / "p" / "common.toml").write_text(
        f'[run]\nworld_size = 4\nnnodes = 2\nrdzv_endpoint = "{ENDPOINT}"\n')
    (tmp_path / "configs" / "p" / "w.toml").write_text("[x]\na = 1\n")
    pkg = tmp_path / "toypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    # the toy worker publishes its target, as a stage would
    (pkg / "w.py").write_text("import os, pathlib\n"
                              "pathlib.Path(os.environ['ALIGN_RUN_DIR'], 'out.json').write_text('{}')\n")
    return Project(root=tmp_path, packages=("toypkg",), python=sys.executable)


def launch_of(project):
    spec = StageSpec(name="shards", doc="d", worker="toypkg.w", config="w.toml", distributed=True,
                     targets=lambda ctx: [ctx.run_dir / "out.json"])
    return next(iter(ladder_tasks(project, "p", [spec])))["actions"][0][1][0]


def test_two_nodes_use_the_c10d_rendezvous(project, monkeypatch):
    monkeypatch.setenv("ALIGN_NODE_RANK", "1")
    launch = launch_of(project)
    assert launch.problem is None and launch.node_rank == 1
    assert launch.argv[1:10] == ("-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=2",
                                 "--rdzv-backend=c10d", f"--rdzv-endpoint={ENDPOINT}", "--rdzv-id=align-p-shards",
                                 "--max-restarts=0", "-m")
    assert torchrun_args(RunConfig(world_size=2), "x") == ["--standalone", "--nproc-per-node=2"]


def test_bad_multinode_settings_are_one_clear_problem(project, monkeypatch):
    monkeypatch.setenv("ALIGN_NODE_RANK", "2")
    assert "ALIGN_NODE_RANK='2': expected an integer in [0, 2)" in launch_of(project).problem
    with pytest.raises(ValueError, match="needs rdzv_endpoint"):
        RunConfig(world_size=2, nnodes=2)
    with pytest.raises(ValueError, match=r"nnodes \(3\) must be >= 1 and divide world_size \(4\)"):
        RunConfig(world_size=4, nnodes=3, rdzv_endpoint=ENDPOINT)


def test_only_node_zero_writes_the_receipt(project, monkeypatch):
    for node in (1, 0):
        monkeypatch.setenv("ALIGN_NODE_RANK", str(node))
        launch = launch_of(project)
        # run the toy worker itself (no torchrun agents to meet): what is tested is the launcher's epilogue
        launch = dataclasses.replace(launch, argv=(sys.executable, "-m", "toypkg.w"))
        assert execute(launch) is None
        assert (launch.run_dir / "out.json").is_file()
        assert launch.receipt.is_file() == (node == 0), node
