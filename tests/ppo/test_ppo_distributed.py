"""PPO on two gloo ranks (CPU), the policy under DDP or FSDP2 and the critic replicated beside it (DDP) or sharded
like it (FSDP2), trains the same
policy and critic as one process on the same prompts: the two ranks sample disjoint halves of each rollout, the
advantages are whitened over both, the critic's gradients are averaged, so every step's numbers and the final
weights agree with the single-process run to float-summation noise; stopped mid-rollout and resumed on two ranks,
it ends bit for bit where the uninterrupted two-rank run does (critic and its Adam state included; a replicated critic's
checkpoint holds rank 0's copy only, rank 1's state points at it; a sharded one's holds each rank's shard in that
rank's file). Worker:
dist_ppo_worker.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from dist_ppo_worker import run  # noqa: E402 (also puts tests/rl on the path, through ppo_fixtures)
from rl_fixtures import launch_two_ranks  # noqa: E402

from align.train.checkpoint import optimizer_file  # noqa: E402
from align.train.train_module import REPLICATED  # noqa: E402

pytestmark = pytest.mark.distributed
WORKER = Path(__file__).parent / "dist_ppo_worker.py"


def single_process(out: Path) -> dict:
    run("single", out, "single_ranks1")
    return torch.load(out / "single_ranks1.pt", weights_only=True)


@pytest.mark.parametrize("strategy", [pytest.param("ddp", marks=pytest.mark.slow), "fsdp"])  # ddp: slow tier
def test_two_ranks_train_the_policy_and_critic_of_one_process(tmp_path, strategy):
    proc = launch_two_ranks(WORKER, strategy, str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    two = torch.load(tmp_path / f"{strategy}_ranks2.pt", weights_only=True)
    one = single_process(tmp_path)
    assert one["code"] == two["code"] == 0
    assert [r["critic_only"] for r in two["history"]] == [1.0, 1.0, 0.0, 0.0]
    for a, b in zip(one["history"], two["history"]):  # every step: same rows, same losses, norms, tripwire inputs
        assert a["sequences"] == b["sequences"] == 16 and a["applied"] == b["applied"] == 1
        for key in ("loss", "value_loss", "reward_mean", "explained_variance", "critic_grad_norm",
                    "ratio_abs_log_mean", "critic_extra_loss_first", "adv_abs_mean"):
            assert (a[key] is None) == (b[key] is None), (key, a["step"])  # NaN (None) where undefined
            if a[key] is not None:
                assert abs(a[key] - b[key]) <= 1e-4 * max(1.0, abs(a[key])), (key, a["step"], a[key], b[key])
    for name in ("policy", "critic"):
        for key, w in one[name].items():
            err = float((two[name][key] - w).abs().max())
            assert err <= 1e-4, (name, key, err)
    resumed = torch.load(tmp_path / f"{strategy}_ranks2_resumed.pt", weights_only=True)  # stopped at 3, resumed
    assert two["resumed_from"] == "" and resumed["resumed_from"].endswith("step_3")
    ckpt = Path(resumed["resumed_from"])
    saved = torch.load(ckpt / "resume.pt", weights_only=True)["ranks"]
    if strategy == "ddp":  # the replicated critic: one copy, rank 0's
        assert "critic" in saved[0]["extra"] and "critic" not in saved[1]["extra"]
        assert saved[1]["extra"][REPLICATED] == ["critic", "critic_optimizer"]
    else:  # the sharded critic: each rank's shard and Adam state in its own file, nothing in the gathered state
        assert all("critic" not in r["extra"] for r in saved)
        shards = [torch.load(ckpt / optimizer_file(r), weights_only=True)["critic"] for r in range(2)]
        for key, w in two["critic"].items():  # each rank holds its dim-0 half, not a copy
            assert [s[key].shape[0] for s in shards] == [-(-w.shape[0] // 2), w.shape[0] // 2], key
            assert torch.cat([s[key] for s in shards]).shape == w.shape, key
    assert [r["step"] for r in resumed["history"]] == [1, 2, 3, 4]
    for name in ("policy", "critic", "critic_exp_avg"):
        assert resumed[name].keys() == two[name].keys()
        for key, w in two[name].items():
            assert torch.equal(resumed[name][key], w), (name, key)
