"""align.rl.grpo_module on a real tiny model: exact on-policy gradients, weight pushes with versions, extra state,
and (through the Trainer) a policy that learns the parity task and resumes bit-exactly."""

import math

import pytest
import torch

from align.kernels import ce_rows
from align.rl.grpo_loss import GrpoLossConfig
from align.rl.stage_config import RolloutShape
from align.rl.token_logprobs import completion_logprobs
from align.train.train_module import AccumInfo, StepOutcome
from align.train.trainer import Trainer, TrainerConfig
from rl_fixtures import make_client, make_module, make_source, tiny_model

KERNELS = [pytest.param("native", marks=pytest.mark.skipif(not ce_rows.available(), reason="no C compiler")),
           "torch"]  # the head's row passes ([loss] kernel)


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
    assert batch["old_from_forward"]  # pi_old of the first window is its own training forward
    batch["rollout_logprobs"] = module.score(batch) * batch["completion_mask"]  # a sampler that matches exactly
    out = module.loss(module.model, batch)
    assert out.sums["rho_abs_log_sum"] == 0 and out.sums["rho_capped"] == 0 and out.sums["rho_outliers"] == 0
    assert out.sums["ratio_sum"] == out.sums["loss_tokens"]  # every ratio exactly 1 (training forward == scoring)
    (out.loss / batch["loss_mask"].sum()).backward()
    got = [p.grad.clone() for p in module.model.parameters()]
    module.model.zero_grad()
    logp, _ = completion_logprobs(module.model, batch, 0.8)
    (-(batch["advantages"][:, None] * logp * batch["loss_mask"]).sum() / batch["loss_mask"].sum()).backward()
    for g, p in zip(got, module.model.parameters()):
        assert torch.allclose(g, p.grad, rtol=1e-5, atol=1e-6)


def test_old_from_forward_is_refused_once_the_policy_has_moved():
    module, _, window = first_window()
    module.step = 1  # as if an optimizer step had been taken since the rollout
    with pytest.raises(RuntimeError, match="lags the policy by 1"):
        module.loss(module.model, window[0])


def test_weights_reach_the_sampler_after_each_applied_step():
    module, client, window = first_window()
    engine = client.engine.model
    units = sum(module.loss_units(mb) for mb in window)
    for i, mb in enumerate(window):
        module.train_batch(mb, AccumInfo(i, len(window), units, 1))
    assert module.optim_step() is StepOutcome.APPLIED and module.version == 1 == client.weight_version
    for (name, p), (_, q) in zip(module.model.named_parameters(), engine.named_parameters()):
        assert torch.equal(p, q), name
    module.zero_grads()
    module._window_bad.fill_(True)  # a non-finite window: the step is skipped and nothing is pushed
    assert module.optim_step() is StepOutcome.SKIPPED and client.weight_version == 1


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

    run(tmp_path, 20)
    rewards = [r["reward_mean"] for r in read_history(tmp_path / "run" / "history.jsonl")]
    assert sum(rewards[-4:]) / 4 > sum(rewards[:4]) / 4 + 0.2, rewards  # from ~0.5 (chance) towards 1
    assert all(math.isfinite(r) for r in rewards)


def test_interrupted_run_resumes_bit_exactly(tmp_path):
    whole = run(tmp_path, 5, "whole")
    run(tmp_path, 5, "split", stop_at=3)  # stops mid-rollout (2 windows per rollout): pending windows saved
    resumed = run(tmp_path, 5, "split")
    for (name, a), (_, b) in zip(whole.model.named_parameters(), resumed.model.named_parameters()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("loss", [GrpoLossConfig(), GrpoLossConfig(normalisation="sequence", kl_beta=0.05),
                                  GrpoLossConfig(rho_cap=1.05, rho_mask_low=0.99, rho_mask_high=1.01)])
def test_fused_head_equals_the_recomputing_head(loss, kernel):
    """Gradients formed in forward (3 head GEMMs) equal the recompute-in-backward path (4), value and gradient,
    with the head's row passes in torch ops or in C."""
    import dataclasses

    results = []
    for fused in (True, False):
        module, _, window = first_window(dataclasses.replace(loss, fused=fused, chunk_size=7, kernel=kernel),
                                         temperature=0.9)
        assert module.native == (kernel == "native")
        batch = dict(window[0])
        batch.pop("old_from_forward")  # pi_old given: ratios differ from 1, and rho varies around 1
        noise = torch.randn(batch["rollout_logprobs"].shape, generator=torch.Generator().manual_seed(0))
        batch["old_logprobs"] = batch["rollout_logprobs"] + 0.02 * noise * batch["completion_mask"]
        batch["ref_logprobs"] = batch["rollout_logprobs"] - 0.1
        out = module.loss(module.model, batch)
        out.loss.backward()
        results.append((out, {n: p.grad.clone() for n, p in module.model.named_parameters()}))
    (fused_out, fused_grads), (plain_out, plain_grads) = results
    assert fused_out.loss.item() == pytest.approx(plain_out.loss.item(), rel=1e-6, abs=1e-6)
    for key in ("entropy_sum", "ratio_sum", "rho_outliers", "kl_sum", "clip_high"):
        assert fused_out.sums[key].item() == pytest.approx(plain_out.sums[key].item(), rel=1e-5, abs=1e-5), key
    for name, g in fused_grads.items():
        assert torch.allclose(g, plain_grads[name], rtol=1e-4, atol=1e-6), name


def test_bf16_head_stays_close_to_the_fp32_head():
    """head_dtype bf16 (CPU speed option): the GEMMs round their operands to bf16, the softmax stays fp32."""
    results = []
    for head in ("float32", "bfloat16"):
        module, _, window = first_window(GrpoLossConfig(head_dtype=head))
        batch = dict(window[0])
        out = module.loss(module.model, batch)
        out.loss.backward()
        grad = torch.cat([p.grad.flatten() for p in module.model.parameters()])
        results.append((out.loss.item(), out.sums["entropy_sum"].item(), grad))
    (l32, e32, g32), (l16, e16, g16) = results
    assert l16 == pytest.approx(l32, rel=2e-2, abs=2e-2) and e16 == pytest.approx(e32, rel=1e-2)
    assert torch.nn.functional.cosine_similarity(g32, g16, dim=0) > 0.99


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("temperature", [0.6, 1.0])
def test_sampler_and_trainer_log_probs_agree_at_the_sampling_temperature(temperature, kernel):
    """The engine's per-token log-probs (the behaviour policy of rho) and the trainer's scoring of the same tokens
    (pi_old and the training forward) are both log softmax(z / T): with the same weights they agree, so rho == 1
    and the ratio is exact at any rollout temperature. At T != 1 the untempered log-probs differ visibly, so a path
    that forgot the temperature on either side would fail here."""
    module, _, window = first_window(GrpoLossConfig(kernel=kernel), temperature=temperature)
    batch = dict(window[0])
    mask = batch["completion_mask"].bool()
    trainer = module.score(batch)[mask]
    sampler = batch["rollout_logprobs"][mask]
    assert torch.allclose(trainer, sampler, atol=2e-5), float((trainer - sampler).abs().max())
    out = module.loss(module.model, batch)  # the fused training forward (pi_old from it) on the same rows
    assert out.sums["rho_abs_log_sum"].item() / out.sums["completion_tokens"].item() < 2e-5
    assert out.sums["ratio_sum"].item() == out.sums["loss_tokens"].item()  # pi_old is this forward: r == 1
    if temperature != 1.0:
        untempered, _ = completion_logprobs(module.model, batch, 1.0)
        assert (untempered[mask] - sampler).abs().max() > 1e-2
