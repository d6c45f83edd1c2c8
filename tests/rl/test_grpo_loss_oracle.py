"""Oracle: align.rl.grpo_loss equals TRL's GRPO loss computation (GRPOTrainer._compute_loss, run as TRL ships it)
on the same tensors, value and gradient to 1e-6, wherever TRL's variant is the same formula:

    ours "sequence" normalisation == TRL loss_type "grpo";  "token" == "bnpo" and "dapo" (one micro-batch: TRL's
    num_items_in_batch is the batch's token count);  "constant" == "dr_grpo" (L = max_completion_length);
    ratio_level "sequence" == importance_sampling_level "sequence" (GSPO);  kl_beta == beta (k3);  dual_clip == delta;
    the train/infer weight multiplies the per-token loss as TRL's vLLM importance-sampling ratio does.

TRL computes its importance-sampling ratio inside generation (not a function one can call), so the weight given to
both sides here is ours; its formula (rho = exp(old - rollout), truncation, masking) is tested by hand in
test_grpo_loss.py. TRL's model call is replaced by returning the given per-token log-probs: everything after it is
TRL's own code."""

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from align.rl.grpo_loss import GrpoLossConfig, clip_fractions, loss_sum, loss_units, policy_terms, train_infer_weight

pytestmark = pytest.mark.oracle
trl_grpo = pytest.importorskip("trl.trainer.grpo_trainer")

B, C, L = 4, 6, 8
NORM_TO_TRL = {"sequence": "grpo", "token": "bnpo", "constant": "dr_grpo"}


def tensors(seed: int):
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, C, generator=gen) * 2.0
    old = logp + 0.5 * torch.randn(B, C, generator=gen)  # ratios far enough from 1 that both clips bind
    roll = old + 0.2 * torch.randn(B, C, generator=gen)
    ref = logp + 0.5 * torch.randn(B, C, generator=gen)
    mask = torch.ones(B, C)
    mask[0, 4:] = 0
    mask[2, 2:] = 0
    adv = torch.tensor([-1.0, 0.5, 0.8, 1.2])
    return logp, old, roll, ref, mask, adv


def trl_loss(logp, inputs, *, loss_type, level="token", beta=0.0, eps=(0.2, 0.28), delta=None, corrected=False,
             entropies=None, entropy_coef=0.0):
    """TRL's GRPOTrainer._compute_loss on given per-token log-probs (and entropies, for its entropy bonus)."""
    fake = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (
            logp, torch.zeros_like(logp) if entropies is None else entropies, None),
        aux_loss_enabled=False, top_entropy_quantile=1.0, off_policy_mask_threshold=None,
        importance_sampling_level=level, beta=beta, loss_type=loss_type, epsilon_low=eps[0], epsilon_high=eps[1],
        args=SimpleNamespace(delta=delta, use_bias_correction_kl=False, steps_per_generation=1),
        use_vllm=corrected, vllm_importance_sampling_correction=corrected, model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1, max_completion_length=L, _entropy_bonus_enabled=entropy_coef > 0,
        entropy_coef=entropy_coef, use_adaptive_entropy=False,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        accelerator=SimpleNamespace(num_processes=1, sync_gradients=True, gather=lambda x: x,
                                    reduce=lambda x, reduction="sum": x, gather_for_metrics=lambda x: x))
    return trl_grpo.GRPOTrainer._compute_loss(fake, None, inputs)


def inputs_for(old, ref, mask, adv, is_ratio=None):
    out = {"prompt_ids": torch.ones(B, 1, dtype=torch.long), "prompt_mask": torch.ones(B, 1, dtype=torch.long),
           "completion_ids": torch.ones(B, C, dtype=torch.long), "completion_mask": mask.long(),
           "advantages": adv, "old_per_token_logps": old, "ref_per_token_logps": ref,
           "num_items_in_batch": mask.sum()}
    if is_ratio is not None:
        out["importance_sampling_ratio"] = is_ratio
    return out


def ours(logp, old, roll, ref, mask, adv, cfg: GrpoLossConfig):
    terms = policy_terms(logp, old, roll, adv, mask, cfg, ref)
    return loss_sum(terms.per_token, mask, cfg.normalisation) / loss_units(mask, cfg.normalisation, L)


def compare(cfg: GrpoLossConfig, trl_kwargs: dict, seed=0, corrected=False):
    logp, old, roll, ref, mask, adv = tensors(seed)
    if not corrected:
        roll = old  # rho == 1: no correction on either side
    a = logp.clone().requires_grad_(True)
    mine = ours(a, old, roll, ref, mask, adv, cfg)
    mine.backward()
    b = logp.clone().requires_grad_(True)
    w = train_infer_weight(old, roll, mask, cfg.rho_level, cfg.rho_cap, cfg.rho_mask_low, cfg.rho_mask_high)
    theirs = trl_loss(b, inputs_for(old, ref, mask, adv, w.weight if corrected else None), corrected=corrected,
                      **trl_kwargs)
    theirs.backward()
    assert mine.item() == pytest.approx(theirs.item(), abs=1e-6, rel=1e-6)
    assert torch.allclose(a.grad, b.grad, atol=1e-6, rtol=1e-6)
    return float(mine.detach())


def test_the_cases_exercise_both_clips():
    logp, old, _, _, mask, adv = tensors(0)
    low, high = clip_fractions(torch.exp(logp - old), adv, GrpoLossConfig())
    assert bool((low & (mask > 0)).any()) and bool((high & (mask > 0)).any())


@pytest.mark.parametrize("norm", ["sequence", "token", "constant"])
def test_token_level_clipped_surrogate_matches_trl(norm):
    compare(GrpoLossConfig(normalisation=norm), {"loss_type": NORM_TO_TRL[norm]})


def test_token_normalisation_matches_trl_dapo():
    compare(GrpoLossConfig(normalisation="token"), {"loss_type": "dapo"})


def test_gspo_sequence_level_ratio_matches_trl():
    compare(GrpoLossConfig(ratio_level="sequence", normalisation="sequence", clip_low=3e-4, clip_high=4e-4),
            {"loss_type": "grpo", "level": "sequence", "eps": (3e-4, 4e-4)})


def test_k3_kl_term_matches_trl():
    compare(GrpoLossConfig(normalisation="token", kl_beta=0.04), {"loss_type": "bnpo", "beta": 0.04})


def test_dual_clip_matches_trl_delta():
    compare(GrpoLossConfig(normalisation="sequence", dual_clip=1.5), {"loss_type": "grpo", "delta": 1.5})


@pytest.mark.parametrize("mask_low,mask_high", [(None, None), (0.8, 1.25)])
def test_train_infer_weight_composes_like_trl_importance_sampling(mask_low, mask_high):
    cfg = GrpoLossConfig(normalisation="token", rho_cap=1.2, rho_mask_low=mask_low, rho_mask_high=mask_high)
    compare(cfg, {"loss_type": "bnpo"}, seed=3, corrected=True)
