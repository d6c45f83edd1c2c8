"""align.rl.ppo on a real tiny model (GRPO's parity task): the policy learns, the critic-only warmup moves nothing but
the critic and is not a skip, stale rollouts are refused, the ratio tripwire skips (and the Trainer counts it), the
KL goes to the reward or to the loss, and an interrupted run resumes bit-exactly, critic and its optimizer included."""

from __future__ import annotations

import math

import pytest
import torch

from align.kernels import ce_rows
from align.rl.ppo.entropy import token_entropy
from align.rl.ppo.loss import PpoLossConfig, policy_rows, value_per_token
from align.rl.ppo.rewards import reward_model_scorer, token_rewards
from align.rl.ppo.stage_config import PpoConfig
from align.rl.grpo_loss import k3_kl
from align.rl.stage_config import RolloutShape
from align.rl.ppo.gae import GaeConfig
from align.reward.rm_module import RmHeadConfig, critic_from_policy
from align.train.train_module import AccumInfo, StepOutcome
from align.train.trainer import Trainer, TrainerConfig
from align.utils.tracking import read_history
from ppo_fixtures import SHAPE, make_ppo
from rl_fixtures import train_window


needs_native = pytest.mark.skipif(not ce_rows.available(), reason="no C compiler to build csrc/ce_rows.c")


def fit(tmp_path, name, steps, stop_at=None, **kw):
    module, client, source = make_ppo(tmp_path, steps=steps, **kw)
    trainer = Trainer(TrainerConfig(max_steps=stop_at or steps, checkpoint_every=1), module, source, tmp_path / name)
    assert trainer.fit() == 0
    return module, client, trainer, read_history(tmp_path / name / "history.jsonl")


def params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_token_rewards_put_the_score_on_the_last_token():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.float32)
    logp, ref = -torch.rand(3, 4), -torch.rand(3, 4)
    rewards, kl = token_rewards(torch.tensor([1.0, 0.5, 7.0]), mask, logp, ref, beta=0.1)
    expected = -0.1 * (logp - ref) * mask
    expected[0, 2] += 1.0
    expected[1, 0] += 0.5  # row 2 has no token: its score has nowhere to go (and no loss token)
    assert torch.allclose(rewards, expected) and torch.allclose(kl, (logp - ref) * mask)
    with pytest.raises(ValueError, match="reference"):
        token_rewards(torch.ones(3), mask, logp, None, beta=0.1)


def test_entropy_gradient_equals_the_full_softmax():
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(7, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.randn(11, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    mine = token_entropy(h, w, temperature=0.7, chunk_size=3)
    (mine * torch.arange(7.0)).sum().backward()
    got = h.grad.clone(), w.grad.clone()
    h.grad, w.grad = None, None
    p = torch.softmax(h @ w.t() / 0.7, -1)
    ref = -(p * p.log()).sum(-1)
    (ref * torch.arange(7.0)).sum().backward()
    assert torch.allclose(mine.double(), ref, atol=1e-6)
    assert torch.allclose(got[0], h.grad, atol=1e-5) and torch.allclose(got[1], w.grad, atol=1e-5)


def test_the_policy_learns_the_parity_reward(tmp_path):
    shape = RolloutShape(prompts=4, samples=8, max_new_tokens=4, num_minibatches=2, micro_batch_size=16,
                         truncated="keep")
    _, _, _, rows = fit(tmp_path, "run", 20, ppo=PpoConfig(kl_beta=0.05), shape=shape)
    rewards = [r["reward_mean"] for r in rows]
    assert sum(rewards[-4:]) / 4 > sum(rewards[:4]) / 4 + 0.2, rewards  # from ~0.5 (chance) towards 1
    for key in ("loss", "policy_loss", "value_loss", "explained_variance", "ratio_mean", "rollout/kl"):
        assert all(math.isfinite(r[key]) for r in rows if r[key] is not None), key
    assert sum(r["explained_variance"] is not None for r in rows) == 20
    assert rows[-1]["rollout/kl"] is None and rows[-2]["rollout/kl"] > 0  # logged on a rollout's first step


def test_critic_warmup_moves_only_the_critic_and_is_not_a_skip(tmp_path):
    module, client, source = make_ppo(tmp_path, ppo=PpoConfig(critic_warmup_rollouts=1))
    policy0, critic0 = params(module.model), params(module.critic)
    it = iter(source)
    for _ in range(SHAPE.steps_per_rollout):  # rollout 0: critic only
        window = next(it)
        assert all(mb["critic_only"] for mb in window)
        assert train_window(module, window) is StepOutcome.APPLIED
    assert module.version == 0 == client.weight_version  # no policy step, nothing pushed
    assert all(torch.equal(p, policy0[n]) for n, p in module.model.named_parameters())
    assert any(not torch.equal(p, critic0[n]) for n, p in module.critic.named_parameters())
    window = next(it)  # rollout 1 trains both
    assert not window[0]["critic_only"] and train_window(module, window) is StepOutcome.APPLIED
    assert module.version == 1 == client.weight_version
    engine = client.engine.model
    for (name, p), (_, q) in zip(module.model.named_parameters(), engine.named_parameters()):
        assert torch.equal(p, q), name

    _, _, trainer, rows = fit(tmp_path, "run", 4, ppo=PpoConfig(critic_warmup_rollouts=1))
    assert [r["critic_only"] for r in rows] == [1, 1, 0, 0] and [r["applied"] for r in rows] == [1] * 4
    assert trainer.skips.bad == 0 and rows[-1]["skipped_total"] == 0
    assert rows[0]["grad_norm"] is None and rows[2]["grad_norm"] > 0  # the policy had no gradient in warmup


def rollout_value_loss(module, window) -> float:
    """The critic's value loss (the joint step's term, 1/2 max(plain, clipped)) over a window's loss tokens."""
    total = tokens = 0.0
    for mb in window:
        v_tok, _ = value_per_token(module.values(mb), mb["old_values"], mb["returns"], module.ppo_loss.value_clip)
        total, tokens = total + float((v_tok * mb["loss_mask"]).sum()), tokens + float(mb["loss_mask"].sum())
    return total / tokens


@pytest.mark.parametrize("warmup", [0, 1])
def test_extra_value_passes_fit_the_rollout_and_leave_the_policy_as_without(tmp_path, warmup):
    # lr 1e-3 (not the fixture's 2e-2, at which Adam's first steps overshoot this small fit)
    plain, plain_client, plain_source = make_ppo(tmp_path, ppo=PpoConfig(critic_warmup_rollouts=warmup), lr=1e-3)
    extra, extra_client, extra_source = make_ppo(tmp_path, ppo=PpoConfig(critic_warmup_rollouts=warmup,
                                                                         critic_extra_epochs=3), lr=1e-3)
    window, same = next(iter(plain_source)), next(iter(extra_source))
    assert all(torch.equal(a["returns"], b["returns"]) for a, b in zip(window, same))  # the same rollout
    assert train_window(plain, window) is StepOutcome.APPLIED and train_window(extra, same) is StepOutcome.APPLIED
    # the policy's step, its version and its push are the joint step's alone: bitwise those of the plain module
    assert extra.version == plain.version == extra_client.weight_version == plain_client.weight_version == 1 - warmup
    for (name, p), (_, q) in zip(plain.model.named_parameters(), extra.model.named_parameters()):
        assert torch.equal(p, q), name
    for (name, p), (_, q) in zip(plain.model.named_parameters(), extra_client.engine.model.named_parameters()):
        assert torch.equal(p, q), name
    # the first extra pass starts where the plain module's critic ended; each pass lowers the rollout's value loss
    first, last = extra.last["critic_extra_loss_first"], extra.last["critic_extra_loss_last"]
    assert first == pytest.approx(rollout_value_loss(plain, window), rel=1e-5)
    after = rollout_value_loss(extra, same)
    assert after < last < first, (first, last, after)
    assert extra.last["critic_extra_steps"] == 3 and extra.last["critic_extra_skipped"] == 0
    assert plain.last["critic_extra_steps"] == 0 and math.isnan(plain.last["critic_extra_loss_first"])


def test_a_non_finite_extra_pass_is_not_stepped_and_not_a_skip(tmp_path, monkeypatch):
    plain, _, plain_source = make_ppo(tmp_path)
    module, _, source = make_ppo(tmp_path, ppo=PpoConfig(critic_extra_epochs=2))
    window = next(iter(source))
    assert train_window(plain, next(iter(plain_source))) is StepOutcome.APPLIED
    calls, real = [], module.critic_net._loss_fn  # every value goes through the critic's unit

    def poisoned(critic, batch):  # the joint step's forwards are finite, the extra passes' are not
        calls.append(1)
        out = real(critic, batch)
        return out * math.nan if len(calls) > len(window) else out

    monkeypatch.setattr(module.critic_net, "_loss_fn", poisoned)
    assert train_window(module, window) is StepOutcome.APPLIED  # the joint step stands
    assert len(calls) == 3 * len(window)
    assert module.last["critic_extra_skipped"] == 2 and module.last["critic_extra_steps"] == 0
    for (name, p), (_, q) in zip(plain.critic.named_parameters(), module.critic.named_parameters()):
        assert torch.equal(p, q), name  # neither poisoned pass was stepped
    _, _, trainer, rows = fit(tmp_path, "run", 2, ppo=PpoConfig(critic_extra_epochs=2))
    assert [r["applied"] for r in rows] == [1, 1] and trainer.skips.bad == 0
    assert [r["critic_extra_steps"] for r in rows] == [2, 2] and [r["critic_extra_skipped"] for r in rows] == [0, 0]


def test_a_rollout_from_stale_weights_is_never_trained_on(tmp_path):
    module, client, source = make_ppo(tmp_path)
    module.client = None  # the weight push is lost: the engine keeps version 0
    it = iter(source)
    for _ in range(SHAPE.steps_per_rollout):  # the current rollout's windows (within the staleness bound)
        assert train_window(module, next(it)) is StepOutcome.APPLIED
    assert module.version == 2 and client.weight_version == 0
    with pytest.raises(RuntimeError, match="engine was not updated"):
        next(it)


def test_a_window_staler_than_the_bound_is_refused(tmp_path):
    shape = RolloutShape(prompts=4, samples=4, max_new_tokens=4, num_minibatches=2, micro_batch_size=8,
                         truncated="keep", max_staleness=0, on_stale="refuse")
    module, client, source = make_ppo(tmp_path, shape=shape)
    it = iter(source)
    assert train_window(module, next(it)) is StepOutcome.APPLIED
    window = next(it)  # the rollout's second window lags by 1 > 0: refused; this one comes from a fresh rollout
    assert int(window[0]["weight_version"][0]) == 1 == module.version
    assert window[0]["stats"]["rollout/refused_windows"] == 1


def test_ratio_tripwire_skips_the_step_and_the_trainer_counts_it(tmp_path):
    _, _, trainer, rows = fit(tmp_path, "run", 4, ppo=PpoConfig(ratio_skip_abs_log=1e-3))
    # a rollout's first step trains on the weights that sampled it (|log r| = 0); the second has moved past 1e-3
    assert [r["ratio_skipped"] for r in rows] == [0, 1, 0, 1], [r["ratio_abs_log_mean"] for r in rows]
    assert [r["applied"] for r in rows] == [1, 0, 1, 0] and [r["skipped_total"] for r in rows] == [0, 1, 1, 2]
    assert rows[1]["ratio_abs_log_mean"] > 1e-3 and rows[0]["ratio_abs_log_mean"] < 1e-3
    assert trainer.module.version == 2


def test_kl_in_the_loss_adds_beta_k3(tmp_path):
    module, _, source = make_ppo(tmp_path, ppo=PpoConfig(kl_beta=0.1, kl_in="loss"))
    batch = dict(next(iter(source))[0])
    batch["ref_logprobs"] = batch["ref_logprobs"] - 0.3 * batch["completion_mask"]  # a reference away from pi
    with_kl = module.loss(module.model, batch)
    module.ppo = PpoConfig(kl_beta=0.1, kl_in="reward")
    without = module.loss(module.model, batch)
    logp = batch["old_logprobs"]  # the first window trains on the sampling weights: logp == old up to rounding
    expected = 0.1 * (k3_kl(logp, batch["ref_logprobs"]) * batch["loss_mask"]).sum()
    assert (with_kl.loss - without.loss).item() == pytest.approx(expected.item(), rel=1e-4)
    assert with_kl.sums["kl_sum"] > 0 and without.sums["kl_sum"] == 0


@pytest.mark.parametrize("extra", [0, 2])
def test_interrupted_run_resumes_bit_exactly_critic_included(tmp_path, extra):
    kw = dict(ppo=PpoConfig(critic_warmup_rollouts=1, kl_beta=0.05, critic_extra_epochs=extra))
    whole, _, _, _ = fit(tmp_path, "whole", 5, **kw)
    fit(tmp_path, "split", 5, stop_at=3, **kw)  # stops mid-rollout (2 windows per rollout): pending windows saved
    resumed, _, trainer, _ = fit(tmp_path, "split", 5, **kw)
    assert trainer.resumed_from is not None
    for a, b in ((whole.model, resumed.model), (whole.critic, resumed.critic)):
        for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
            assert torch.equal(p, q), name
    sa, sb = whole.critic_optimizer.state_dict()["state"], resumed.critic_optimizer.state_dict()["state"]
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k]["exp_avg"], sb[k]["exp_avg"]) for k in sa)


def test_a_checkpoint_without_critic_state_is_refused(tmp_path):
    module, _, _ = make_ppo(tmp_path)
    with pytest.raises(ValueError, match="not a PPO checkpoint"):
        module.load_extra_state({"health": {}})


def test_a_reward_model_score_joins_the_verifier_reward(tmp_path):
    _, _, plain = make_ppo(tmp_path)
    rm = critic_from_policy(tmp_path / "start", seed=9)  # a real (untrained) Bradley-Terry critic
    _, _, scored = make_ppo(tmp_path, reward_model=reward_model_scorer(rm), reward_model_weight=0.5)
    a, b = next(iter(plain)), next(iter(scored))  # same seeds, same weights: the same samples
    for x, y in zip(a, b):
        assert torch.equal(x["completion_ids"], y["completion_ids"])
        ends = x["completion_start"] + x["completion_mask"].sum(1).long()
        with torch.no_grad():  # the score head on each row's last real token, read from the full forward
            own = torch.stack([rm(x["input_ids"][i:i + 1, :int(e)])[0, int(e) - 1] for i, e in enumerate(ends)])
        assert torch.allclose(y["rewards"] - x["rewards"], 0.5 * own, atol=1e-5)
        assert not torch.equal(x["token_advantages"], y["token_advantages"])
    assert b[0]["stats"]["rollout/rm_rows"] == 16 and a[0]["stats"]["rollout/rm_rows"] == 0


ONE_WINDOW = RolloutShape(prompts=4, samples=4, max_new_tokens=4, num_minibatches=1, micro_batch_size=8,
                          truncated="keep")


@pytest.mark.parametrize("kernel", ["torch", pytest.param("native", marks=needs_native)])
def test_one_window_without_kl_in_the_reward_takes_pi_old_from_its_own_forward(tmp_path, kernel):
    calls = []
    for ppo, from_forward in ((PpoConfig(kl_beta=0.0), True), (PpoConfig(kl_beta=0.1, kl_in="loss"), True),
                              (PpoConfig(kl_beta=0.1, kl_in="reward"), False)):
        module, _, source = make_ppo(tmp_path, ppo=ppo, shape=ONE_WINDOW, loss=PpoLossConfig(kernel=kernel))
        scored = module.score
        source.old_scorer = lambda batch: calls.append(1) or scored(batch)
        calls.clear()
        window = next(iter(source))
        assert all(bool(mb.get("old_from_forward")) is from_forward for mb in window)
        assert bool(calls) is not from_forward  # the policy's scoring pass is skipped exactly when not needed
        if from_forward:  # the same loss as with pi_old scored separately (the same head, the same weights)
            mb = window[0]
            own = module.loss(module.model, mb)
            explicit = module.loss(module.model, {**{k: v for k, v in mb.items() if k != "old_from_forward"},
                                                  "old_logprobs": scored(mb)})
            assert own.loss.item() == pytest.approx(explicit.loss.item(), rel=1e-6, abs=1e-7)
            # the scorer and the training forward run the same head kernel: the same bits, a ratio of exactly 1
            assert own.sums["ratio_abs_log_sum"] == 0 and explicit.sums["ratio_abs_log_sum"] == 0
    _, _, _, rows = fit(tmp_path, "run", 3, ppo=PpoConfig(kl_beta=0.0), shape=ONE_WINDOW)
    assert [r["applied"] for r in rows] == [1, 1, 1]  # the version check holds after every applied step


def test_a_stale_window_flagged_old_from_forward_is_refused(tmp_path):
    module, _, source = make_ppo(tmp_path, ppo=PpoConfig(kl_beta=0.0), shape=ONE_WINDOW)
    window = next(iter(source))
    assert train_window(module, window) is StepOutcome.APPLIED
    with pytest.raises(RuntimeError, match="old_from_forward"):  # replaying it: its forward is no longer pi_old
        module.loss(module.model, window[0])


def test_negative_scale_zero_keeps_only_the_positive_advantages(tmp_path):
    _, _, plain = make_ppo(tmp_path)
    _, _, psr = make_ppo(tmp_path, gae_cfg=GaeConfig(negative_scale=0.0))
    a, b = next(iter(plain)), next(iter(psr))  # same seeds, same weights: the same samples and advantages
    for x, y in zip(a, b):
        assert (x["token_advantages"] < 0).any()
        assert torch.equal(y["token_advantages"], x["token_advantages"].clamp(min=0.0))


def test_the_critic_head_lr_scale_gives_the_value_head_its_own_group(tmp_path):
    module, _, _ = make_ppo(tmp_path, critic_head=RmHeadConfig(lr_scale=10.0))
    groups = {g["name"]: g for g in module.critic_optimizer.param_groups}
    head = [g for name, g in groups.items() if name.startswith("score_head")]
    assert len(head) == 1 and head[0]["lr"] == pytest.approx(10 * 2e-2)
    assert {id(p) for p in head[0]["params"]} == {id(p) for p in module.critic.score.parameters()}
    assert all(g["lr"] == pytest.approx(2e-2) for name, g in groups.items() if not name.startswith("score_head"))


def window_grads(module, window):
    """The policy's and the critic's gradients after the window's micro-batches (no step)."""
    units = sum(module.loss_units(mb) for mb in window)
    for i, mb in enumerate(window):
        module.train_batch(mb, AccumInfo(i, len(window), units, 1))
    grads = [p.grad.clone() for p in module.model.parameters()] + [p.grad.clone() for p in module.critic.parameters()]
    module.zero_grads()
    return grads


@pytest.mark.parametrize("kl_in", ["reward", "loss"])
def test_skipping_the_rows_without_a_policy_gradient_leaves_the_gradients_as_training_them(tmp_path, kl_in):
    ppo, gae_cfg = PpoConfig(kl_beta=0.05, kl_in=kl_in), GaeConfig(negative_scale=0.0)
    grads, calls = {}, {}
    for mode in ("train", "skip"):
        module, _, source = make_ppo(tmp_path, ppo=ppo, gae_cfg=gae_cfg, shape=ONE_WINDOW,
                                     loss=PpoLossConfig(zero_gradient_rows=mode))
        rows_seen = []
        forward = module.model.forward_hidden
        module.model.forward_hidden = lambda ids, _f=forward: rows_seen.append(ids.shape[0]) or _f(ids)
        window = next(iter(source))
        rows_seen.clear()  # the batch source's scoring passes (pi_old for the KL in the reward) do not count
        dead = sum(int((mb["token_advantages"] == 0).all(1).sum()) for mb in window)
        grads[mode], calls[mode] = window_grads(module, window), (sum(rows_seen), dead)
    total = sum(mb["loss_mask"].shape[0] for mb in window)
    assert calls["train"][0] == total and calls["train"][1] > 0  # the wrong samples carry no policy gradient
    if kl_in == "loss":  # the KL acts on every token: nothing may be left out
        assert calls["skip"][0] == total
    else:
        assert calls["skip"][0] == total - calls["skip"][1]
    for a, b in zip(grads["train"], grads["skip"]):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)


def test_a_micro_batch_without_a_policy_gradient_forwards_its_shortest_row():
    mb = {"token_advantages": torch.zeros(3, 4), "loss_mask": torch.ones(3, 4),
          "completion_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]])}
    assert policy_rows(mb, PpoLossConfig(), PpoConfig(kl_beta=0.0)).tolist() == [1]
    mb["token_advantages"][2, 1] = 0.5
    assert policy_rows(mb, PpoLossConfig(), PpoConfig(kl_beta=0.0)).tolist() == [2]
    assert policy_rows(mb, PpoLossConfig(entropy_coef=0.01), PpoConfig(kl_beta=0.0)) is None
    mb["token_advantages"][:, 0] = 1.0
    assert policy_rows(mb, PpoLossConfig(), PpoConfig(kl_beta=0.0)) is None
