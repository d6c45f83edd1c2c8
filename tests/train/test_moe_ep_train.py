"""Expert parallelism in the TrainModule path (worker: moe_ep_train_worker.py; gloo CPU ranks): one window of MoE
SFT with aux losses and one clipped optimizer step through `build_train_module` with `parallel.expert_parallel`
equal the run without EP, under DDP (fp64) and FSDP2 (fp32, the shards kept out of the sharded units), with and
without activation checkpointing (the recomputed forward issues its all-to-alls again inside backward).

What each check catches: the finalized expert-shard gradients equal the non-EP averaged gradient's slice (a
skipped `finalize_expert_grads` leaves them `ep` times too large, a missing replicate-group sum R times too small);
the norm of the expert gradients alone equals the non-EP one (a shard left out of the global norm, or counted
once per replica, changes it); grad_norm and clip_coef (clipping active) and every weight after the step equal."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "model"))
from gloo_ranks import run_ranks  # noqa: E402

pytestmark = pytest.mark.distributed
WORKER = Path(__file__).parent / "moe_ep_train_worker.py"
TOL = {"ddp": 1e-10, "fsdp": 1e-6, "fsdp_ac": 1e-6}  # relative; fp64 vs fp32 compute, dense layers round by row count
NORM_TOL = 1e-6  # grad_norm's squares are summed in fp32 (align.train.grad_norm), per tensor: shards round apart


@pytest.mark.parametrize("world,ep", [(2, 2), pytest.param(4, 2, marks=pytest.mark.slow),
                                      pytest.param(4, 4, marks=pytest.mark.slow)])
def test_ep_step_equals_non_ep_step(tmp_path, world, ep):
    run_ranks(WORKER, world, str(tmp_path), str(ep))
    for r in range(world):
        res = json.loads((tmp_path / f"ep{ep}_rank{r}.json").read_text())
        for strategy, got in res.items():
            tol, scale = TOL[strategy], got["expert_grad_scale"]
            assert scale > 0, (r, strategy)
            assert got["expert_grads"] <= tol * 10 * scale, (r, strategy, got)
            assert got["replicated_grads"] <= tol * 10, (r, strategy, got)
            assert got["weights"] <= (tol if strategy == "ddp" else 1e-5), (r, strategy, got)
            for key in ("grad_norm", "expert_norm", "clip_coef"):
                plain, sharded = got[key]
                assert sharded == pytest.approx(plain, rel=NORM_TOL), (r, strategy, key)
            assert got["clip_coef"][0] < 1.0  # clipping active


def test_expert_parallel_needs_an_moe_model():
    from align.train.moe_module import build_train_module
    from align.train.parallel import ParallelConfig
    from align.train.sft_loss import SftLossConfig
    from align.train.sft_module import SftTrainModule
    from align.train.train_module import TrainModuleConfig
    from train_helpers import tiny_model

    cfg = TrainModuleConfig(parallel=ParallelConfig(expert_parallel=2))
    with pytest.raises(ValueError, match="needs an MoE model"):
        build_train_module(SftTrainModule, tiny_model(), cfg, SftLossConfig(), 1, moe_aux=None, stage="sft")
    with pytest.raises(ValueError, match="expert_parallel must be an integer >= 1"):
        ParallelConfig(expert_parallel=0)
