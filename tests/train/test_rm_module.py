"""RmTrainModule on a real tiny critic: the last-token pick, one stacked forward equal to the critic's own per-token
values, window normalisation (two micro-batches = one batch of all the pairs), logged metrics, and learning."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from align.model import MistralForValueHead
from align.train.optim import OptimizerConfig
from align.reward.rm_loss import RmLossConfig
from align.reward.rm_module import RmHeadConfig, RmTrainModule, last_token_index, model_scorer, pair_rewards, reward_eval
from align.train.schedulers import SchedulerConfig
from align.train.train_module import AccumInfo, TrainModuleConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))
from model_helpers import tiny_config  # noqa: E402


def _critic(seed: int = 0, dtype=torch.float64) -> MistralForValueHead:
    torch.manual_seed(seed)
    return MistralForValueHead(tiny_config(hidden_size=32, intermediate_size=48)).to(dtype)


def _batch(p: int, seed: int = 0, separable: bool = False) -> dict:
    """Right-padded pairs of varied lengths; `separable`: chosen arms end in token 5, rejected ones in token 6."""
    g = torch.Generator().manual_seed(seed)
    t = 12
    out = {}
    for arm, last in (("chosen", 5), ("rejected", 6)):
        ids = torch.randint(7, 128, (p, t), generator=g)
        lengths = torch.randint(4, t + 1, (p,), generator=g)
        mask = torch.arange(t)[None, :] < lengths[:, None]
        if separable:
            ids[torch.arange(p), lengths - 1] = last
        out[f"{arm}_input_ids"] = ids.masked_fill(~mask, 0)
        out[f"{arm}_attention_mask"] = mask
        out[f"{arm}_labels"] = ids.masked_fill(~mask, -100)
    out["pair_index"] = torch.arange(p)
    return out


def _module(critic, lr: float = 1e-3, **loss) -> RmTrainModule:
    cfg = TrainModuleConfig(optimizer=OptimizerConfig(lr=lr, max_grad_norm=None), scheduler=SchedulerConfig())
    return RmTrainModule(critic, cfg, RmLossConfig(**loss), total_steps=100)


def test_last_token_index_is_the_last_attended_position():
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)
    assert last_token_index(mask).tolist() == [2, 4, 0]


def test_stacked_forward_equals_the_critics_own_values_at_the_last_token():
    critic = _critic()
    batch = _batch(5)
    scored = pair_rewards(critic, batch)
    for arm, got in (("chosen", scored.chosen), ("rejected", scored.rejected)):
        ids, mask = batch[f"{arm}_input_ids"], batch[f"{arm}_attention_mask"]
        values = critic(ids, mask)  # (B, T): the score at every position
        want = values[torch.arange(5), mask.sum(1) - 1]
        torch.testing.assert_close(got, want.float())


def _grads(module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in module.model.parameters()]


def test_two_micro_batches_equal_one_batch_of_all_pairs():
    batch = _batch(6, seed=1)
    halves = [{k: v[:3] for k, v in batch.items()}, {k: v[3:] for k, v in batch.items()}]
    one = _module(_critic(), center_rewards_coefficient=0.1, margin=0.2)
    m = one.train_batch(batch, AccumInfo(0, 1, 6.0, 1))
    two = _module(_critic(), center_rewards_coefficient=0.1, margin=0.2)
    sums = [two.train_batch(h, AccumInfo(i, 2, 6.0, 1)).sums for i, h in enumerate(halves)]
    for a, b in zip(_grads(one), _grads(two)):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)
    total = {k: sum(s[k] for s in sums) for k in sums[0]}
    for k, v in m.sums.items():
        torch.testing.assert_close(total[k], v, atol=1e-5, rtol=1e-6)
    logged = one.log_metrics({k: float(v) for k, v in m.sums.items()})
    assert logged["pairs"] == 6 and 0 <= logged["rewards/accuracy"] <= 1
    assert logged["loss"] > logged["bt_loss"]  # the centering term adds a positive amount
    assert math.isclose(logged["rewards/margin"], logged["rewards/chosen"] - logged["rewards/rejected"],
                        rel_tol=1e-5, abs_tol=1e-6)


def _swapped(batch: dict) -> dict:
    return {k.replace("chosen", "@").replace("rejected", "chosen").replace("@", "rejected"): v for k, v in batch.items()}


def _fit(critic, train: dict, steps: int = 30) -> tuple[RmTrainModule, list[float]]:
    module, losses = _module(critic, lr=3e-3), []
    for _ in range(steps):
        m = module.train_batch(train, AccumInfo(0, 1, 16.0, 1))
        module.optim_step()
        module.zero_grads()
        losses.append(float(m.sums["objective_sum"]) / 16)
    return module, losses


def test_learns_the_labelled_direction_and_reward_eval_sees_it():
    """The same separable pairs with the labels one way and swapped: each critic learns its own direction (a
    random head may rank these pairs either way before training)."""
    train, held = _batch(16, seed=3, separable=True), _batch(16, seed=4, separable=True)
    for data, want_right in ((train, True), (_swapped(train), False)):
        critic = _critic(seed=2, dtype=torch.float32)
        before = reward_eval(model_scorer(critic), [held])
        module, losses = _fit(critic, data)
        after = reward_eval(module.score, [held])
        assert losses[-1] < 0.5 * losses[0]
        assert (after["accuracy"] >= 0.75) if want_right else (after["accuracy"] <= 0.25)
        assert (after["margin"] > before["margin"]) == want_right
        assert after["pairs"] == 16 and module.model.training  # score() restores training mode


def test_head_lr_scale_gives_the_score_head_its_own_group_and_a_larger_first_step():
    """[head] lr_scale: every parameter stays in exactly one group, the head's group has the scaled lr, and Adam's
    first step (|update| ~ lr per element) moves the head ~lr_scale times as far as the trunk."""
    critic = _critic(seed=1, dtype=torch.float32)
    cfg = TrainModuleConfig(optimizer=OptimizerConfig(lr=1e-3, max_grad_norm=None),
                            scheduler=SchedulerConfig(name="constant"))
    module = RmTrainModule(critic, cfg, RmLossConfig(), total_steps=10, head=RmHeadConfig(lr_scale=10.0))
    groups = {g["name"]: g for g in module.optimizer.param_groups}
    assert [id(p) for p in groups["score_head"]["params"]] == [id(p) for p in critic.score.parameters()]
    grouped = sorted(id(p) for g in module.optimizer.param_groups for p in g["params"])
    assert grouped == sorted(id(p) for p in critic.parameters())
    before = {n: p.detach().clone() for n, p in critic.named_parameters()}
    batch = _batch(8, seed=5, separable=True)
    module.train_batch(batch, AccumInfo(micro_index=0, num_micro=1, global_units=8.0, world_size=1))
    module.optim_step()
    moved = {n: float((p.detach() - before[n]).abs().max()) for n, p in critic.named_parameters()}
    assert math.isclose(groups["score_head"]["lr"], 1e-2)
    assert 5e-3 < moved["score.weight"] <= 1.01e-2
    assert max(v for n, v in moved.items() if not n.startswith("score.")) <= 1.01e-3
    with pytest.raises(ValueError, match="lr_scale"):
        RmHeadConfig(lr_scale=0.0)
