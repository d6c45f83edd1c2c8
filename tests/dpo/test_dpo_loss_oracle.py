"""Oracle: align.train.dpo_loss equals TRL 1.16 DPOTrainer's loss on the same log-prob tensors (loss, gradients,
logged rewards), to 1e-6.

TRL's loss is not a standalone function, so the real trainer runs its real `_compute_loss` on a tiny transformers
model; forward hooks capture the per-token log-prob tensors TRL's policy and reference forwards produced, and our
loss is computed from exactly those tensors. Gradients are compared with respect to the captured policy log-probs
and to every model parameter. The model runs in float64 so that a formula difference cannot hide in rounding."""

from __future__ import annotations

import os

import pytest
import torch

from align.train.dpo_loss import DpoLossConfig, dpo_loss

pytest.importorskip("trl")
pytestmark = pytest.mark.oracle
os.environ.setdefault("TQDM_DISABLE", "1")

from trl_fixtures import dpo_trainer, preference_texts, tiny_hf_mistral  # noqa: E402

PAIRS = 4
TOL = dict(atol=1e-6, rtol=1e-6)


def _trainer(tmp_path, **dpo_args):
    policy = tiny_hf_mistral(seed=0, dtype=torch.float64)
    ref = tiny_hf_mistral(seed=1, dtype=torch.float64)  # a different reference, so log-ratios are not zero
    return dpo_trainer(policy, ref, preference_texts(PAIRS, seed=3), str(tmp_path), PAIRS, **dpo_args)


def _run_trl(trainer, batch):
    """TRL's loss, plus the per-token log-probs (2P, T-1) of its policy and reference forwards."""
    captured = {}
    hooks = [trainer.model.register_forward_hook(lambda m, i, o: captured.__setitem__("policy", o.log_probs)),
             trainer.ref_model.register_forward_hook(lambda m, i, o: captured.__setitem__("ref", o.log_probs))]
    try:
        loss = trainer._compute_loss(trainer.model, batch, return_outputs=False)
    finally:
        for h in hooks:
            h.remove()
    return loss, captured["policy"], captured["ref"]


def _ours(per_tok, ref_per_tok, batch, cfg):
    # shape: per-token (2P, T-1), chosen rows first -> per-sequence (2P,) -> two (P,) arms
    pc, pr = per_tok.sum(1).chunk(2)
    rc, rr = ref_per_tok.sum(1).chunk(2)
    chosen_tokens = batch["completion_mask"][:, 1:].sum(1).chunk(2)[0]
    return dpo_loss(pc, pr, rc, rr, cfg, chosen_tokens=chosen_tokens)


def _grads(loss, per_tok, params, batch):
    """d loss / d (per-token log-probs at completion positions, every parameter). Outside the completion mask TRL's
    log-prob tensor holds constant zeros (masked_scatter), whose gradient reaches nothing, so it is not compared."""
    g_tok, *g_params = torch.autograd.grad(loss, [per_tok, *params], retain_graph=True)
    return [g_tok * batch["completion_mask"][:, 1:], *g_params]


def _assert_same_loss_and_grads(loss_ours, loss_trl, per_tok, model, batch):
    torch.testing.assert_close(loss_ours, loss_trl, **TOL)
    params = [p for p in model.parameters() if p.requires_grad]
    g_ours, g_trl = _grads(loss_ours, per_tok, params, batch), _grads(loss_trl, per_tok, params, batch)
    for a, b in zip(g_ours, g_trl, strict=True):
        torch.testing.assert_close(a, b, **TOL)
    assert all(g.abs().sum() > 0 for g in g_ours[1:3])  # the comparison is not vacuous


def _batch(trainer, rows):
    return trainer.data_collator([trainer.train_dataset[i] for i in rows])


@pytest.mark.parametrize("beta,alpha", [(0.1, 0.0), (0.5, 0.7)])
def test_sigmoid_and_nll_mix_match_trl(tmp_path, beta, alpha):
    losses = ["sigmoid", "sft"] if alpha else ["sigmoid"]
    trainer = _trainer(tmp_path, beta=beta, loss_type=losses, loss_weights=[1.0, alpha] if alpha else None)
    batch = _batch(trainer, range(PAIRS))
    loss_trl, per_tok, ref_per_tok = _run_trl(trainer, batch)
    out = _ours(per_tok, ref_per_tok, batch, DpoLossConfig(beta=beta, nll_alpha=alpha))

    _assert_same_loss_and_grads(out.loss, loss_trl, per_tok, trainer.model, batch)

    logged = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    mine = out.metrics()
    for ours_key, trl_key in [("rewards/chosen", "rewards/chosen"), ("rewards/rejected", "rewards/rejected"),
                              ("rewards/margin", "rewards/margins"), ("rewards/accuracy", "rewards/accuracies")]:
        assert mine[ours_key] == pytest.approx(logged[trl_key], abs=1e-6), ours_key


def test_label_smoothing_matches_trl_per_pair(tmp_path):
    """Conservative DPO: TRL 1.16's sigmoid ignores label_smoothing; its "aot" term is cDPO after sorting the
    batch's log-ratios, and sorting one pair is the identity, so each pair is checked on its own."""
    eps, beta = 0.2, 0.3
    trainer = _trainer(tmp_path, beta=beta, loss_type=["aot"], label_smoothing=eps)
    cfg = DpoLossConfig(beta=beta, label_smoothing=eps)
    for row in range(PAIRS):
        batch = _batch(trainer, [row])
        loss_trl, per_tok, ref_per_tok = _run_trl(trainer, batch)
        out = _ours(per_tok, ref_per_tok, batch, cfg)
        _assert_same_loss_and_grads(out.loss, loss_trl, per_tok, trainer.model, batch)
