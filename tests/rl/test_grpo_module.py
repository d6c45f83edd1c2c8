"""align.rl.grpo_module on a real tiny model: exact on-policy gradients, weight pushes with versions, extra state,
and (through the Trainer) a policy that learns the parity task and resumes bit-exactly."""

import math

import torch

from align.rl.grpo_loss import GrpoLossConfig
from align.rl.stage_config import RolloutShape
from align.rl.token_logprobs import completion_logprobs
from align.train.train_module import AccumInfo
from align.train.trainer import Trainer, TrainerConfig
from rl_fixtures import make_client, make_module, make_source, tiny_model


def first_window(loss=GrpoLossConfig(), temperature=1.0):
    model = tiny_model()
    client = make_client(model)
    module = make_module(model, client, loss=loss, temperature=temperature)
    shape = RolloutShape(prompts=4, samples=4, temperature=temperature, max_new_tokens=6, num_minibatches=1,
                         micro_batch_size=16)
    return module, client, next(iter(make_source(module, client, shape=shape)))


def test_rho_correction_recovers_exact_advantage_when_logprobs_match():
    """Rollout log-probs equal to the trainer's (old == rollout): rho and the ratio are exactly 1 in the real
    module, and its gradient is exactly that of the plain policy gradient -sum(A logp m) / tokens."""
    module, _, window = first_window(GrpoLossConfig(rho_cap=2.0, rho_mask_low=0.5, rho_mask_high=2.0),
                                     temperature=0.8)
    batch = dict(window[0])
    batch["rollout_logprobs"] = batch["old_logprobs"].clone()
    out = module.loss(module.model, batch)
    assert out.sums["rho_abs_log_sum"] == 0 and out.sums["rho_capped"] == 0 and out.sums["rho_outliers"] == 0
    assert out.sums["ratio_sum"] == out.sums["loss_tokens"]  # every ratio exactly 1 (training forward == scoring)
    (out.loss / batch["loss_mask"].sum()).backward()
    got = [p.grad.clone() for p in module.model.parameters()]
    module.model.zero_grad()
    logp, _ = completion_logprobs(module.model, batch, 0.8)
    (-(batch["advantages"][:, None] * logp * batch["loss_mask"]).sum() / batch["loss_mask"].sum()).backward()
    for g, p in zip(got, module.model.parameters()):
        assert torch.allclose(g, p.grad, rtol=1e-5, atol=1e-8)


def test_weights_reach_the_sampler_after_each_applied_step():
    module, client, window = first_window()
    engine = client.engine.model
    units = sum(module.loss_units(mb) for mb in window)
    for i, mb in enumerate(window):
        module.train_batch(mb, AccumInfo(i, len(window), units, 1))
    assert module.optim_step() and module.version == 1 == client.weight_version
    for (name, p), (_, q) in zip(module.model.named_parameters(), engine.named_parameters()):
        assert torch.equal(p, q), name
    module.zero_grads()
    module._window_bad.fill_(True)  # a non-finite window: the step is skipped and nothing is pushed
    assert not module.optim_step() and client.weight_version == 1


def test_health_state_round_trips_through_extra_state():
    module, _, _ = first_window()
    for r in [1.0] * 6 + [0.1] * 2:
        module.health.observe({"reward_mean": r, "entropy": 1.0, "ratio_mean": 1.0})
    state = module.extra_state()
    other, _, _ = first_window()
    other.load_extra_state(state)
    assert other.extra_state() == state and other.health.collapse_run == 2


def run(tmp_path, steps, name="run", stop_at=None):
    model = tiny_model()
    client = make_client(model)
    module = make_module(model, client, lr=2e-2, steps=steps)
    shape = RolloutShape(prompts=4, samples=8, max_new_tokens=4, num_minibatches=2, micro_batch_size=8,
                         truncated="keep")  # the random model never says EOS: every completion is cut
    source = make_source(module, client, shape=shape)
    cfg = TrainerConfig(max_steps=stop_at or steps, checkpoint_every=1)
    Trainer(cfg, module, source, tmp_path / name).fit()
    return module


def test_the_policy_learns_the_parity_reward(tmp_path):
    from align.utils.tracking import read_history

    run(tmp_path, 14)
    rewards = [r["reward_mean"] for r in read_history(tmp_path / "run" / "history.jsonl")]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.25, rewards
    assert all(math.isfinite(r) for r in rewards)


def test_interrupted_run_resumes_bit_exactly(tmp_path):
    whole = run(tmp_path, 5, "whole")
    run(tmp_path, 5, "split", stop_at=3)  # stops mid-rollout (2 windows per rollout): pending windows saved
    resumed = run(tmp_path, 5, "split")
    for (name, a), (_, b) in zip(whole.model.named_parameters(), resumed.model.named_parameters()):
        assert torch.equal(a, b), name
