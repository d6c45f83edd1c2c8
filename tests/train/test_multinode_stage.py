"""Two nodes on one machine: two torchrun agents (1 gloo rank each) meeting at the c10d rendezvous on loopback, with
the flags pipeline.launcher gives a 2-node profile, run the SFT stage of the smoke profile (made small) and publish
weights bitwise equal to one node with 2 ranks; SIGKILL of one node's worker stops both agents (non-zero exits,
seconds, no hang until the collective timeout)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from align.profile import RunConfig
from pipeline.launcher import torchrun_args
from test_stage_sft import ROOT, SMALL, runs  # noqa: F401  (runs: the module fixture building the SFT shards)

sys.path.insert(0, str(Path(__file__).parents[1] / "model"))
from gloo_ranks import free_port  # noqa: E402

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # three torchrun launches: ~70 s


def agents(runs, run_dir: Path, *overrides: str, nnodes: int = 2) -> list[subprocess.Popen]:  # noqa: F811
    run = RunConfig(world_size=2, nnodes=nnodes, rdzv_endpoint=f"127.0.0.1:{free_port()}" if nnodes > 1 else "")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), ALIGN_RUNS_DIR=str(runs),
               ALIGN_RUN_DIR=str(run_dir), CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, "-m", "torch.distributed.run", *torchrun_args(run, "align-test"), "-m", "align.stages.sft",
           "--config", str(ROOT / "configs/smoke/sft.toml"), *SMALL, "loader.grad_accum=2", *overrides]
    run_dir.mkdir(parents=True, exist_ok=True)
    return [subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=open(run_dir / f"agent{n}.log", "w"),
                             stderr=subprocess.STDOUT, start_new_session=True) for n in range(nnodes)]


def test_two_agents_on_loopback_equal_one_node(runs, tmp_path):  # noqa: F811
    from align.model.checkpoint import load_checkpoint

    if torch.cuda.is_available():
        pytest.skip("the runs are pinned to CPU")
    for name, nnodes in (("one", 1), ("two", 2)):
        codes = [a.wait(timeout=400) for a in agents(runs, tmp_path / name, nnodes=nnodes)]
        assert codes == [0] * nnodes, (tmp_path / name / "agent0.log").read_text()[-3000:]
    one, two = (load_checkpoint(tmp_path / d / "final").state_dict() for d in ("one", "two"))
    assert one.keys() == two.keys() and all(torch.equal(one[k], two[k]) for k in one)


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def test_killing_one_nodes_worker_stops_both(runs, tmp_path):  # noqa: F811
    if torch.cuda.is_available():
        pytest.skip("the runs are pinned to CPU")
    procs = agents(runs, tmp_path / "kill", "train.max_steps=400", "train.checkpoint_every=1000")
    history = tmp_path / "kill" / "history.jsonl"
    try:
        deadline = time.monotonic() + 240
        while not (history.exists() and history.read_text().count("\n") >= 2):  # both ranks are training
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
            time.sleep(0.5)
        os.kill(_children(procs[1].pid)[0], signal.SIGKILL)
        t0 = time.monotonic()
        codes = [p.wait(timeout=120) for p in procs]
        assert all(c != 0 for c in codes) and time.monotonic() - t0 < 60, codes
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
