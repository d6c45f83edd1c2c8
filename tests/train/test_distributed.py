"""Two gloo ranks under torch.distributed.run (CPU): FSDP2 and DDP equal one process; bit-exact resume after a crash
mid-window; the control plane (SIGTERM to one rank, a NaN on one rank, one rank over the wall budget, a tripwire on
one rank) stops both ranks at the same boundary with the same verdict and no hang. Worker: dist_worker.py."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from align.train import checkpoint as ckpt_io
from align.utils.tracking import read_history
from train_helpers import ListLoader, assert_bitwise_equal, build_sft, sft_windows, weights

pytestmark = pytest.mark.distributed
ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).parent / "dist_worker.py"
TIMEOUT_S = 300  # far below the 1800 s process-group timeout: a hang fails the test, it does not stall CI


def launch(modes: str, out: Path, *extra: str) -> subprocess.CompletedProcess:
    # NOTE: CPU + gloo even on a GPU host (two ranks on one GPU would ask for cuda:1); CUDA runs are the gpu tier
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(WORKER),
           modes, str(out), *extra]
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)


def outcome(out: Path, name: str) -> list[tuple[int, int]]:
    """(exit code, step) per rank."""
    return [tuple(map(int, (out / f"{name}_exit_rank{r}.txt").read_text().split())) for r in range(2)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    proc = launch("equivalence,resume,plain:ref", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The same global windows (2 ranks x 2 micro-batches) as one window of 4 in one process."""
    if torch.cuda.is_available():
        pytest.skip("the in-process reference would run on the GPU; the 2-rank runs are pinned to CPU")
    t = build_sft(tmp_path_factory.mktemp("single"), max_steps=4, checkpoint_every=0, accum=4,
                  loader=ListLoader(sft_windows(5, 4)))
    assert t.fit() == 0
    return weights(t.module), read_history(t.run_dir / "history.jsonl")


@pytest.mark.parametrize("variant", ["fsdp", "ddp", "fsdp_ac", "fsdp_sync"])
def test_two_ranks_equal_one_process(runs, one_process, variant):
    expected, history = one_process
    got = torch.load(runs / f"{variant}.pt", weights_only=True)
    for k in expected:
        torch.testing.assert_close(got[k], expected[k], rtol=0, atol=1e-6, msg=k)
    rows = read_history(runs / variant / "history.jsonl")
    for mine, ref in zip(rows, history):  # the loss is normalised by the global token count, not per rank
        assert mine["loss_tokens"] == ref["loss_tokens"]
        assert mine["loss"] == pytest.approx(ref["loss"], rel=1e-6)
        assert mine["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-5)


def test_fsdp_bf16_compute_stays_close_to_fp32(runs, one_process):
    # bf16 params for compute, fp32 master and fp32 gradient reduction: the same losses and gradient norms as fp32
    # within bf16 rounding. (Weights are not compared element-wise: Adam's update is ~lr * sign(g), so elements
    # with near-zero gradients flip under any rounding noise.)
    expected, history = one_process
    got = torch.load(runs / "fsdp_bf16.pt", weights_only=True)
    assert all(got[k].dtype == torch.float32 for k in got)  # the sharded master stays fp32
    assert any(not torch.equal(got[k], expected[k]) for k in got)  # bf16 compute did happen
    for mine, ref in zip(read_history(runs / "fsdp_bf16" / "history.jsonl"), history):
        assert mine["loss"] == pytest.approx(ref["loss"], rel=1e-3)
        assert mine["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-2)


@pytest.mark.parametrize("optimizer", ["adamw", "adamw8bit"])
def test_two_rank_crash_mid_window_then_resume_is_bitwise_equal(runs, optimizer):
    saved = torch.load(runs / f"resume_{optimizer}.pt", weights_only=True)
    assert_bitwise_equal(saved["full"], saved["resumed"])


def _sigterm_trial(runs: Path, tmp: Path, at_step: int, victim: int) -> None:
    proc = launch("sigterm:cut", tmp, "--at-step", str(at_step), "--victim", str(victim))
    assert proc.returncode != 0  # torchrun reports the workers' 143 as a failure
    assert outcome(tmp, "cut") == [(143, at_step)] * 2, proc.stderr[-2000:]  # both ranks, the same boundary
    assert ckpt_io.latest_checkpoint(tmp / "cut" / "checkpoints").name == f"step_{at_step}"
    assert not (tmp / "cut" / "HALT.json").exists()
    proc = launch("plain:cut", tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_bitwise_equal(torch.load(runs / "ref.pt", weights_only=True), torch.load(tmp / "cut.pt", weights_only=True))


def test_sigterm_to_one_rank_stops_both_and_resumes_bitwise(runs, tmp_path):
    rng = random.Random(os.environ.get("ALIGN_TEST_SEED", "6"))
    _sigterm_trial(runs, tmp_path, at_step=rng.randint(1, 7), victim=rng.randint(0, 1))


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(5))
def test_sigterm_at_random_points(runs, tmp_path, trial):
    rng = random.Random(1000 + trial)
    _sigterm_trial(runs, tmp_path, at_step=rng.randint(1, 8), victim=rng.randint(0, 1))


def test_one_rank_verdicts_halt_both_ranks_together(tmp_path):
    proc = launch("tripwire:trip,wall:wall,nan:nan,dry:dry", tmp_path, "--at-step", "4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    # a tripwire on rank 0 alone: both raise 80 at step 4 with the same message, HALT.json says why
    assert outcome(tmp_path, "trip") == [(80, 4)] * 2
    reasons = {(tmp_path / f"trip_reason_rank{r}.txt").read_text() for r in range(2)}
    assert reasons == {"tripwire at step 4: rank 0: synthetic verdict"}
    assert json.loads((tmp_path / "trip" / "HALT.json").read_text())["exit_code"] == 80
    # only rank 1 over the wall budget: both checkpoint and exit 82 at the same boundary
    (code0, step0), (code1, step1) = outcome(tmp_path, "wall")
    assert code0 == code1 == 82 and step0 == step1 <= 4
    assert ckpt_io.latest_checkpoint(tmp_path / "wall" / "checkpoints").name == f"step_{step0}"
    assert json.loads((tmp_path / "wall" / "HALT.json").read_text())["exit_code"] == 82
    # NaN losses on rank 1 only from step 4: both skip steps 4-7, then halt 81 (4 > 3 consecutive)
    assert outcome(tmp_path, "nan") == [(81, 7)] * 2
    assert json.loads((tmp_path / "nan" / "HALT.json").read_text())["exit_code"] == 81
    rows = read_history(tmp_path / "nan" / "history.jsonl")
    assert [r["applied"] for r in rows] == [1.0] * 3 + [0.0] * 4
    # rank 1's data ends after 4 windows: both ranks end the run there together
    assert outcome(tmp_path, "dry") == [(0, 4)] * 2
    assert ckpt_io.latest_checkpoint(tmp_path / "dry" / "checkpoints").name == "step_4"
