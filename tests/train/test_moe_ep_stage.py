"""The SFT stage with `[parallel] expert_parallel = 2` under torchrun (2 gloo ranks, FSDP2 for the rest, the
olmoe_tiny profile's config made small, over the full
vocabulary its `runs` shards use): the published weights equal the 2-rank run without EP (fp32
tolerance), and the published file is an ordinary OLMoE checkpoint of all experts."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from test_stage_sft import ROOT, SMALL, runs  # noqa: F401  (runs: the module fixture building the SFT shards)

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # two torchrun launches: ~40 s


def torchrun_sft(runs, run_dir, *overrides: str) -> str:  # noqa: F811
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), ALIGN_RUNS_DIR=str(runs),
               ALIGN_RUN_DIR=str(run_dir), CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m",
           "align.stages.sft", "--config", str(ROOT / "configs/olmoe_tiny/sft.toml"), *SMALL, "loader.grad_accum=2",
           "model.moe.num_experts=4",
           "tokenizer.path=mistral-7b-v0.3", "model.init.vocab_size=32768", "inloop_eval.every=0",
           *overrides]  # the `runs` shards: their tokenizer, no eval split
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_sft_stage_with_expert_parallel_equals_without(runs, tmp_path):  # noqa: F811
    from align.model.checkpoint import load_checkpoint

    if torch.cuda.is_available():
        pytest.skip("the 2-rank runs are pinned to CPU")
    assert "expert_parallel" not in torchrun_sft(runs, tmp_path / "plain")
    assert "expert_parallel 2 x 1 replica(s): 2 of 4 experts per rank" in torchrun_sft(
        runs, tmp_path / "ep", "parallel.expert_parallel=2")
    plain, ep = (load_checkpoint(tmp_path / d / "final") for d in ("plain", "ep"))
    assert ep.model.layers[0].mlp.experts.gate_up_proj.shape[0] == 4
    want, got = plain.state_dict(), ep.state_dict()
    assert want.keys() == got.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=1e-6, msg=k)
