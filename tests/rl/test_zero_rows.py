"""Rows with exactly zero loss and gradient left out of the GRPO forward (align.rl.zero_rows): the step's gradient,
normaliser and row statistics are those of the step that trains every row; an all-zero window is the same empty
step; a PPO row is never left out."""

import torch

from align.rl.advantages import AdvantageConfig
from align.rl.grpo_loss import GrpoLossConfig
from align.rl.stage_config import RolloutShape
from align.rl.zero_rows import row_rule, zero_gradient_rows
from align.train.train_module import AccumInfo, StepOutcome
from rl_fixtures import make_client, make_module, make_source, never_right, tiny_model

SHAPE = RolloutShape(prompts=4, samples=4, max_new_tokens=6, num_minibatches=2, micro_batch_size=3,
                     truncated="keep")
ADV = AdvantageConfig(negative_scale=0.0)  # wrong samples get advantage 0, as in the tiny recipe


def run_window(module, window):
    units = sum(module.loss_units(mb) for mb in window)
    sums = {}
    for i, mb in enumerate(window):
        out = module.train_batch(mb, AccumInfo(i, len(window), units, 1))
        for k, v in out.sums.items():
            sums[k] = sums.get(k, 0.0) + float(v)
    grads = {n: p.grad.clone() for n, p in module.model.named_parameters() if p.grad is not None}
    return units, sums, grads, module.optim_step()


def pair(loss=GrpoLossConfig(), verifier=None):
    sides = []
    for rule in (None, row_rule(loss, (0.0, 0.0))):
        model = tiny_model()
        client = make_client(model)
        module = make_module(model, client, loss=loss)
        kw = {"verifier": verifier} if verifier else {}
        sides.append((module, iter(make_source(module, client, shape=SHAPE, advantage=ADV, skip_rows=rule, **kw))))
    return sides


def test_gradient_units_and_counts_equal_the_step_that_trains_every_row():
    (full, it_full), (trim, it_trim) = pair()
    for step in range(2):  # window 2's rows are scored for pi_old before step 1: only the forwarded ones
        wf, wt = next(it_full), next(it_trim)
        n = sum(mb["completion_ids"].shape[0] for mb in wf)
        forwarded = sum(mb["completion_ids"].shape[0] for mb in wt)
        skipped = wt[0].get("skipped", {}).get("loss_mask", torch.zeros(0, 1)).shape[0]
        assert forwarded + skipped == n and 0 < skipped < n
        uf, sf, gf, of = run_window(full, wf)
        ut, st, gt, ot = run_window(trim, wt)
        assert uf == ut and of is ot is StepOutcome.APPLIED
        for key in ("seqs", "units", "loss_tokens", "completion_tokens", "input_tokens", "reward_sum", "correct",
                    "truncated", "adv_abs_sum", "clip_low", "clip_high", "staleness_sum"):
            assert abs(sf[key] - st[key]) <= 1e-5 * max(1.0, abs(sf[key])), key
        assert st["rows_skipped"] == skipped and sf["rows_skipped"] == 0
        assert st["trained_completion_tokens"] < sf["trained_completion_tokens"] == sf["completion_tokens"]
        assert abs(sf["loss_sum"] - st["loss_sum"]) <= 1e-5 * max(1.0, abs(sf["loss_sum"]))
        assert gf.keys() == gt.keys()
        for name in gf:
            scale = float(gf[name].abs().max())
            err = float((gt[name] - gf[name]).abs().max())
            assert err <= 1e-6 * scale, (name, step, err, scale)
        full.zero_grads(), trim.zero_grads()
        with torch.no_grad():  # AdamW magnifies the last bits of tiny gradients: compare step 2 at equal weights
            for p, q in zip(trim.model.parameters(), full.model.parameters()):
                p.copy_(q)


def test_a_window_of_zero_rows_is_the_same_empty_step():
    (full, it_full), (trim, it_trim) = pair(verifier=never_right)  # every advantage 0
    wf, wt = next(it_full), next(it_trim)
    assert len(wt) == 1 and wt[0]["completion_ids"].shape[0] == 1  # one ballast row: the Trainer's window
    uf, sf, _, of = run_window(full, wf)
    ut, st, _, ot = run_window(trim, wt)
    assert of is ot is StepOutcome.EMPTY and full.empty_reason == trim.empty_reason == "zero_advantage"
    assert uf == ut and sf["seqs"] == st["seqs"] == 8 and st["rows_skipped"] == 7
    assert full.step == trim.step == 0
    assert trim.log_metrics(st)["empty/zero_advantage"] == 1.0


def test_kl_moe_aux_and_ppo_rows_are_never_left_out():
    batch = {"completion_ids": torch.zeros(3, 2, dtype=torch.long), "advantages": torch.tensor([0.0, 1.0, 0.0]),
             "loss_mask": torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 0.0]])}
    assert zero_gradient_rows(batch, GrpoLossConfig()).tolist() == [True, False, True]
    assert zero_gradient_rows(batch, GrpoLossConfig(kl_beta=0.1)).tolist() == [False, False, True]  # masked only
    assert not zero_gradient_rows(batch, GrpoLossConfig(), (0.01, 0.0)).any()  # the router loss needs every row
    ppo = {**batch, "token_advantages": torch.zeros(3, 2), "returns": torch.zeros(3, 2)}  # GAE rows + critic
    assert not zero_gradient_rows(ppo, GrpoLossConfig()).any()
    assert row_rule(GrpoLossConfig(zero_gradient_rows="train"), (0.0, 0.0)) is None
