"""Two gloo ranks (CPU) run GRPO on the parity task under DDP and FSDP2: every rank samples its own half of the
prompts with its own sampler, the weights pushed after each step reach both samplers whole (FSDP2: gathered from
the shards, a collective), and the versions agree with the steps. Worker: dist_grpo_worker.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rl_fixtures import launch_two_ranks

pytestmark = pytest.mark.distributed
WORKER = Path(__file__).parent / "dist_grpo_worker.py"


@pytest.mark.parametrize("strategy", [pytest.param("ddp", marks=pytest.mark.slow), "fsdp"])  # ddp: slow tier
def test_two_ranks_push_whole_weights_to_both_samplers(tmp_path, strategy):
    proc = launch_two_ranks(WORKER, strategy, str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = (torch.load(tmp_path / f"{strategy}_rank{r}.pt", weights_only=True) for r in range(2))
    assert r0["code"] == r1["code"] == 0
    assert r0["version"] == r1["version"] == r0["step"] == 3
    assert set(r0["sampled"]).isdisjoint(r1["sampled"])  # each rank its own prompts
    for name, w in r0["weights"].items():  # the trained weights, whole, in both samplers
        assert torch.equal(r0["engine"][name], w) and torch.equal(r1["engine"][name], w), name
    assert len(r0["rewards"]) == 3


@pytest.mark.parametrize("strategy", [pytest.param("ddp", marks=pytest.mark.slow), "fsdp"])  # ddp: slow tier
def test_a_rank_that_leaves_out_every_row_still_meets_the_collectives(tmp_path, strategy):
    """Rank 1 trains no row (all advantages 0), rank 0 some: the same steps, norms and counts as training all."""
    proc = launch_two_ranks(Path(__file__).parent / "dist_zero_rows_worker.py", strategy, str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = torch.load(tmp_path / f"{strategy}_zero_rows.pt", weights_only=True)
    train, skip = runs["train"], runs["skip"]
    assert train["code"] == skip["code"] == 0 and len(train["rows"]) == len(skip["rows"]) == 2
    for a, b in zip(train["rows"], skip["rows"]):
        assert a["sequences"] == b["sequences"] == 8 and a["rows_skipped"] == 0 and b["rows_skipped"] >= 3
        assert a["applied"] == b["applied"] and a["reward_mean"] == b["reward_mean"]
        assert abs(a["grad_norm"] - b["grad_norm"]) <= 1e-5 * a["grad_norm"]
        assert abs(a["loss"] - b["loss"]) <= 1e-5 * max(abs(a["loss"]), 1e-6)
