"""MoE across ranks. Global-scope load balance: 2 gloo ranks x 2 micro-batches (DDP, fp64) give exactly the gradient
of one aux loss (load balance + z-loss) over the whole global batch in one process. FSDP2 (the 3-D experts sharded
on dim 0), with and without activation checkpointing: 2 ranks x 2 micro-batches of MoE SFT equal one process x 4,
moe/* telemetry included (it is reduced over ranks). Worker: moe_dist_worker.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from align.model.moe import load_balancing_loss, router_z_loss
from moe_train_helpers import LB, Z, aux_only_batch, tiny_moe

pytestmark = pytest.mark.distributed
ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).parent / "moe_dist_worker.py"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    if torch.cuda.is_available():
        pytest.skip("the in-process references would run on the GPU; the 2-rank runs are pinned to CPU")
    out = tmp_path_factory.mktemp("moe_dist")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(WORKER),
           str(out)]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_two_ranks_global_scope_equals_one_loss(runs):
    tmp_path = runs
    whole = [aux_only_batch(r) for r in (0, 0, 1, 1)]  # rank 0's two micro-batches, then rank 1's
    batch = {k: torch.cat([b[k] for b in whole]) for k in whole[0]}
    for convention in ("switch", "hf"):
        model = tiny_moe(dtype=torch.float64)
        _, stats = model(batch["input_ids"], batch["attention_mask"], return_router_stats=True)
        (LB * load_balancing_loss(stats, convention) + Z * router_z_loss(stats)).backward()
        got = torch.load(tmp_path / f"grads_{convention}.pt")
        want = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        assert want.keys() <= got.keys()
        assert all(not got[n].any() for n in got.keys() - want.keys())  # the CE path: no label, zero gradient
        assert model.model.layers[1].mlp.gate.weight.grad.abs().max() > 1e-3
        for n in want:
            torch.testing.assert_close(got[n], want[n], rtol=1e-10, atol=1e-14, msg=f"{convention}: {n}")


@pytest.mark.parametrize("variant", ["moe_fsdp", "moe_fsdp_ac"])
def test_fsdp_moe_sft_equals_one_process(runs, tmp_path, variant):
    from align.train.moe_module import moe_module
    from align.train.sft_module import SftTrainModule
    from align.utils.tracking import read_history
    from train_helpers import ListLoader, build_sft, sft_windows, weights

    one = build_sft(tmp_path / "one", accum=4, loader=ListLoader(sft_windows(5, 4)), max_steps=4,
                    checkpoint_every=0, model=tiny_moe(), base=moe_module(SftTrainModule))
    assert one.fit() == 0
    expected, got = weights(one.module), torch.load(runs / f"{variant}.pt", weights_only=True)
    for k in expected:
        torch.testing.assert_close(got[k], expected[k], rtol=0, atol=1e-6, msg=k)
    for mine, ref in zip(read_history(runs / variant / "history.jsonl"), read_history(tmp_path / "one" /
                                                                                     "history.jsonl")):
        assert mine["loss"] == pytest.approx(ref["loss"], rel=1e-6)
        for key in ("moe/lb_loss", "moe/max_vio", "moe/load_entropy"):
            assert mine[key] == pytest.approx(ref[key], rel=1e-6), key
