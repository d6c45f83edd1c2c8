"""Expert parallelism (align.model.moe_ep) on gloo CPU ranks, fp64, against the single-process model on the
rank-ordered concatenation of the EP group's tokens (worker: moe_ep_worker.py).

Bitwise (difference exactly 0.0): block outputs, router logits, per-rank losses, every expert gradient (a rank that
receives zero rows gets exact zeros, not None), and the input gradient through the expert path (routers fed a
detached input). Not bitwise, and not EP's doing: the router's input-gradient GEMM and every replicated parameter's
gradient (a sum over ranks of per-rank partial GEMMs vs one GEMM over all rows; MKL rounds an (N, 8) @ (8, 16)
product differently for N = 5 than for the same rows inside N = 26), held to 1e-13. The full model's logits go
through dense layers of the same kind: 1e-15."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gloo_ranks import run_ranks

pytestmark = pytest.mark.distributed
WORKER = Path(__file__).parent / "moe_ep_worker.py"
EXACT = ("out", "logits", "loss", "expert_grads", "input_grad_expert_path")


def results(tmp_path: Path, world: int, ep: int, case: str, backend: str = "gloo") -> list[dict]:
    run_ranks(WORKER, world, str(tmp_path), str(ep), case, backend, gpus=backend == "nccl")
    return [json.loads((tmp_path / f"{case}_ep{ep}_{backend}_rank{r}.json").read_text()) for r in range(world)]


def check_block(rows: list[dict]) -> None:
    for r, res in enumerate(rows):
        for key in EXACT:
            assert res[key] == 0.0, (r, key, res)
        assert res["expert_grads_present"], r
        assert res["input_grad"] <= 1e-13 and res["replicated_grads"] <= 1e-13, (r, res)


@pytest.mark.parametrize("world,ep", [(2, 2), pytest.param(4, 4, marks=pytest.mark.slow),
                                      pytest.param(4, 2, marks=pytest.mark.slow)])
def test_block_bitwise_equal_to_one_process(tmp_path, world, ep):
    rows = results(tmp_path, world, ep, "block")
    check_block(rows)
    for g in range(0, world, ep):  # every rank got rows; an EP group's received rows = its tokens x top-k
        got = [res["received_rows"] for res in rows[g:g + ep]]
        assert min(got) > 0 and sum(got) == 2 * sum(5 + 3 * r for r in range(g, g + ep))


@pytest.mark.parametrize("world,ep", [(2, 2), pytest.param(4, 2, marks=pytest.mark.slow)])
def test_adversarial_router_and_zero_row_ranks(tmp_path, world, ep):
    """Every token to the last EP rank's experts: the other ranks receive zero rows, still take part in every
    forward and backward all-to-all, and get exact-zero expert gradients."""
    rows = results(tmp_path, world, ep, "adversarial")
    check_block(rows)
    for g in range(0, world, ep):
        got = [res["received_rows"] for res in rows[g:g + ep]]
        assert got[:-1] == [0] * (ep - 1) and got[-1] == 2 * sum(5 + 3 * r for r in range(g, g + ep))


def test_grouped_backend_through_ep(tmp_path):
    """The grouped_mm backend (fp32: it has no fp64 kernel) behind the all-to-all, adversarial routing: the same
    exact checks; the router's gradient, a sum over ranks, within fp32 rounding of its magnitude (~20)."""
    rows = results(tmp_path, 2, 2, "grouped")
    for r, res in enumerate(rows):
        for key in EXACT:
            assert res[key] == 0.0, (r, key, res)
        assert res["expert_grads_present"] and res["replicated_grads"] <= 1e-5, (r, res)
    assert [res["received_rows"] for res in rows] == [0, 2 * (5 + 8)]


@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_olmoe_model_equal_to_one_process(tmp_path, world):
    rows = results(tmp_path, world, world, "model")
    for r, res in enumerate(rows):
        assert res["loss"] == 0.0 and res["expert_grads"] == 0.0 and res["expert_grads_present"], (r, res)
        assert res["logits"] <= 1e-15 and res["replicated_grads"] <= 1e-13, (r, res)
        assert res["received_rows"] > 0


def test_desynchronised_stream_is_reported(tmp_path):
    rows = results(tmp_path, 2, 2, "desync")
    for r, res in enumerate(rows):
        assert res["error"] is not None and "out of step" in res["error"], (r, res)
    assert "EP rank 0 is at call 2" in rows[0]["error"] and "EP rank 0 sent call 2" in rows[1]["error"]


def test_groups_need_a_process_group():
    from align.model.moe_ep import expert_parallel_groups

    with pytest.raises(ValueError, match="needs a process group"):
        expert_parallel_groups(2)


def test_a_sharded_model_refuses_to_be_copied():
    """An in-loop engine copy (or any deepcopy) of a sharded model would hold E/ep experts: refused at the copy."""
    import copy

    from align.model.moe import SparseMoeBlock
    from align.model.moe_ep import ExpertParallel, apply_expert_parallel

    block = SparseMoeBlock(16, 8, 8, 2, norm_topk_prob=False)
    copy.deepcopy(block)  # unsharded: fine
    apply_expert_parallel(block, ExpertParallel(ep=2, world=2, rank=1, ep_group=None, replicate_group=None))
    assert block.experts.gate_up_proj.shape[0] == 4 and block.experts.first == 4
    with pytest.raises(TypeError, match="holds 4 of 8 experts per rank and cannot be copied"):
        copy.deepcopy(block)


two_gpus = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                              reason="needs 2 CUDA devices (one NCCL rank per GPU)")


@pytest.mark.gpu
@two_gpus
@pytest.mark.parametrize("case", ["block", "adversarial"])
def test_nccl_block_bitwise_equal_to_one_process(tmp_path, case):
    """The gloo checks on NCCL, 2 GPUs (same rows, same order into each expert GEMM: bitwise on one GPU model)."""
    check_block(results(tmp_path, 2, 2, case, "nccl"))


@pytest.mark.gpu
@two_gpus
def test_nccl_olmoe_model_equal_to_one_process(tmp_path):
    for r, res in enumerate(results(tmp_path, 2, 2, "model", "nccl")):
        assert res["loss"] == 0.0 and res["expert_grads"] == 0.0 and res["expert_grads_present"], (r, res)
        assert res["logits"] <= 1e-13 and res["replicated_grads"] <= 1e-12, (r, res)
