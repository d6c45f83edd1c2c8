"""Empty GRPO steps: a window with no learning signal (every advantage 0, or no loss token at all) takes no optimizer
step, logs why, logs a loss of 0 rather than NaN, and is not a fault the Trainer's skip cap counts."""

import math

import torch

from align.rl.grpo_loss import GrpoLossConfig
from align.rl.stage_config import DynamicSamplingConfig, RolloutShape
from align.train.train_module import StepOutcome
from align.train.trainer import Trainer, TrainerConfig
from align.utils.tracking import read_history
from rl_fixtures import make_client, make_module, make_source, never_right, tiny_model, train_window

SHAPE = RolloutShape(prompts=4, samples=4, max_new_tokens=6, num_minibatches=1, micro_batch_size=8,
                     truncated="keep")


def setup(loss=GrpoLossConfig()):
    model = tiny_model()
    client = make_client(model)
    module = make_module(model, client, loss=loss)
    return module, client, iter(make_source(module, client, shape=SHAPE))


def weights(module):
    return {n: p.detach().clone() for n, p in module.model.named_parameters()}


def test_zero_advantage_window_takes_no_step_even_with_adam_momentum():
    module, client, it = setup()
    assert train_window(module, next(it)) is StepOutcome.APPLIED and module.step == 1  # a real step: AdamW now carries momentum
    before, state = weights(module), {k: v.clone() for k, v in module.optimizer.state_dict()["state"][0].items()}
    zero = lambda mb: {"advantages": torch.zeros_like(mb["advantages"])}  # noqa: E731
    assert train_window(module, next(it), zero) is StepOutcome.EMPTY  # not a fault
    assert module.empty_reason == "zero_advantage" and module.step == 1 == client.weight_version
    for name, p in module.model.named_parameters():
        assert torch.equal(p, before[name]), name  # a zero-gradient AdamW step would have moved them
    for k, v in module.optimizer.state_dict()["state"][0].items():
        assert torch.equal(v, state[k]), k
    logged = module.log_metrics({"loss_sum": 0.0, "units": 10.0, "seqs": 16.0})
    assert logged["empty_step"] == 1.0 and logged["empty/zero_advantage"] == 1.0
    assert logged["empty/no_loss_tokens"] == 0.0 and logged["loss"] == 0.0


def test_window_without_loss_tokens_is_empty_not_nan():
    module, client, it = setup()
    masked = lambda mb: {"loss_mask": torch.zeros_like(mb["loss_mask"])}  # noqa: E731  every completion cut
    assert train_window(module, next(it), masked) is StepOutcome.EMPTY
    assert module.empty_reason == "no_loss_tokens" and module.step == 0 == client.weight_version
    logged = module.log_metrics({"loss_sum": 0.0, "units": 0.0, "seqs": 16.0})
    assert logged["loss"] == 0.0 and logged["empty/no_loss_tokens"] == 1.0


def test_kl_term_keeps_a_zero_advantage_window_live():
    module, client, it = setup(GrpoLossConfig(kl_beta=0.1))

    def edit(mb):
        return {"advantages": torch.zeros_like(mb["advantages"]), "ref_logprobs": mb["rollout_logprobs"] - 0.5}

    assert train_window(module, next(it), edit) is StepOutcome.APPLIED
    assert module.empty_reason is None and module.step == 1 == client.weight_version


def test_a_run_of_empty_steps_is_logged_and_not_counted_as_skips(tmp_path):
    model = tiny_model()
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    client = make_client(model)
    module = make_module(model, client)
    source = make_source(module, client, shape=SHAPE, verifier=never_right,
                         dynamic=DynamicSamplingConfig(enabled=True, max_rounds=1))
    cfg = TrainerConfig(max_steps=6, max_consecutive_skipped_steps=2)  # 6 empty steps > 2: a fault would halt
    assert Trainer(cfg, module, source, tmp_path / "run").fit() == 0
    rows = read_history(tmp_path / "run" / "history.jsonl")
    assert [r["empty_step"] for r in rows] == [1.0] * 6
    assert [r["applied"] for r in rows] == [0.0] * 6  # no weight moved: the stall probe must not count them
    assert all(r["empty/zero_advantage"] == 1.0 and r["skipped_total"] == 0.0 for r in rows)
    assert all(r["loss"] == 0.0 and math.isfinite(r["grad_norm"]) for r in rows)
    assert all(r["rollout/groups_zero_var"] >= 4 for r in rows)  # dynamic sampling tried, and found nothing
    assert module.step == 0
    for name, p in module.model.named_parameters():
        assert torch.equal(p, initial[name]), name
