"""Global-scope load balance across ranks: 2 gloo ranks x 2 micro-batches (DDP, fp64) give exactly the gradient
of one aux loss (load balance + z-loss) over the whole global batch in one process. Worker: moe_dist_worker.py."""

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


@pytest.mark.skipif(torch.cuda.is_available(), reason="the in-process reference would run on the GPU")
def test_two_ranks_global_scope_equals_one_loss(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(WORKER),
           str(tmp_path)]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
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
