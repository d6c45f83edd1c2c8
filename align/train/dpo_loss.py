"""DPO losses as pure functions on per-sequence summed log-probs.

Notation, per preference pair i (x: prompt, y_c: chosen, y_r: rejected, log-probs summed over completion tokens):

    rho_c = log pi(y_c|x) - log pi_ref(y_c|x)          chosen log-ratio
    rho_r = log pi(y_r|x) - log pi_ref(y_r|x)          rejected log-ratio
    r_c = beta * rho_c,  r_r = beta * rho_r            implicit rewards (what is logged)

    sigmoid DPO (Rafailov et al. 2023), with conservative label smoothing eps (cDPO, Mitchell 2023):
        z   = beta * (rho_c - rho_r)
        l_i = -(1 - eps) * log sigmoid(z) - eps * log sigmoid(-z)
    DPOP (Pal et al. 2024, "Smaug"): the chosen log-ratio is penalised inside the sigmoid when the policy puts less
    mass on y_c than the reference did, so DPO cannot lower both arms together:
        p   = max(0, log pi_ref(y_c|x) - log pi(y_c|x)) = max(0, -rho_c)
        z   = beta * (rho_c - rho_r - lambda * p)
    NLL on the chosen arm (RPO, Pang et al. 2024), a token mean over the batch's chosen tokens:
        nll = -sum_i log pi(y_c,i|x_i) / sum_i |y_c,i|
    total:
        loss = mean_i l_i + alpha * nll

Parity: with eps = 0 and lambda = 0, `loss` equals TRL 1.16 DPOTrainer with loss_type=["sigmoid", "sft"] and
loss_weights=[1, alpha]; with eps > 0 each pair's l_i equals TRL's "aot" term on a batch of one pair (aot sorts
across the batch, which is the identity for one pair). tests/dpo/test_dpo_loss_oracle.py checks both to 1e-6."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class DpoLossConfig:
    """[loss] table of the DPO stage."""

    beta: float = 0.1  # inverse temperature of the implicit reward; larger keeps the policy closer to the reference
    label_smoothing: float = 0.0  # eps: assumed probability that a pair's preference label is flipped (cDPO)
    dpop_lambda: float = 0.0  # lambda: weight of the DPOP penalty on a chosen log-prob falling below the reference's
    nll_alpha: float = 0.0  # alpha: weight of the NLL on the chosen completion (token mean over the batch)
    chunk_size: int = 1024  # completion tokens per logits chunk in the fused head (memory: chunk x vocab x 4 B)

    def __post_init__(self):
        if not self.beta > 0:
            raise ValueError(f"beta must be > 0, got {self.beta}")
        if not 0.0 <= self.label_smoothing < 0.5:
            raise ValueError(f"label_smoothing must lie in [0, 0.5), got {self.label_smoothing}")
        if self.dpop_lambda < 0 or self.nll_alpha < 0:
            raise ValueError(f"dpop_lambda and nll_alpha must be >= 0, got {self.dpop_lambda}, {self.nll_alpha}")
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {self.chunk_size}")


@dataclass(frozen=True)
class DpoLossOutput:
    loss: torch.Tensor  # scalar, differentiable
    per_pair: torch.Tensor  # (P,) preference term l_i, differentiable
    nll: torch.Tensor  # scalar NLL on the chosen arm, detached (0 when nll_alpha == 0 and nothing asked for it)
    chosen_rewards: torch.Tensor  # (P,) beta * rho_c, detached
    rejected_rewards: torch.Tensor  # (P,) beta * rho_r, detached

    def metrics(self) -> dict[str, float]:
        """Batch means of what a DPO run logs: rewards, reward margin, reward (preference) accuracy."""
        margins = self.chosen_rewards - self.rejected_rewards
        return {
            "loss": float(self.loss.detach()),
            "nll": float(self.nll),
            "rewards/chosen": float(self.chosen_rewards.mean()),
            "rewards/rejected": float(self.rejected_rewards.mean()),
            "rewards/margin": float(margins.mean()),
            "rewards/accuracy": float((margins > 0).float().mean()),
        }


def sigmoid_preference_loss(z: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Per-pair l = -(1 - eps) * log sigmoid(z) - eps * log sigmoid(-z), where z is the scaled reward margin."""
    loss = -F.logsigmoid(z)
    if label_smoothing:
        loss = (1.0 - label_smoothing) * loss - label_smoothing * F.logsigmoid(-z)
    return loss


def dpop_penalty(policy_chosen: torch.Tensor, ref_chosen: torch.Tensor) -> torch.Tensor:
    """Per-pair p = max(0, log pi_ref(y_c|x) - log pi(y_c|x)): how far the policy's chosen log-prob fell below the
    reference's. Zero while the policy keeps at least the reference's mass on the chosen completion."""
    return (ref_chosen - policy_chosen).clamp(min=0.0)


def chosen_nll(policy_chosen: torch.Tensor, chosen_tokens: torch.Tensor) -> torch.Tensor:
    """nll = -sum_i log pi(y_c,i|x_i) / sum_i |y_c,i|: a token mean over the whole batch, not a mean of per-pair
    means, so a long chosen completion weighs by its length (TRL's "sft" term does the same)."""
    return -policy_chosen.sum() / chosen_tokens.sum().clamp(min=1).to(policy_chosen.dtype)


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    cfg: DpoLossConfig,
    chosen_tokens: torch.Tensor | None = None,
) -> DpoLossOutput:
    """The total loss of the module docstring. All log-prob inputs are (P,) summed log-probs; the reference ones
    carry no gradient. `chosen_tokens` (P,) completion token counts is required when nll_alpha > 0."""
    ref_chosen, ref_rejected = ref_chosen.detach(), ref_rejected.detach()
    rho_c = policy_chosen - ref_chosen
    rho_r = policy_rejected - ref_rejected
    margin = rho_c - rho_r
    if cfg.dpop_lambda:
        margin = margin - cfg.dpop_lambda * dpop_penalty(policy_chosen, ref_chosen)
    per_pair = sigmoid_preference_loss(cfg.beta * margin, cfg.label_smoothing)
    loss = per_pair.mean()
    nll = policy_chosen.new_zeros(())
    if cfg.nll_alpha:
        if chosen_tokens is None:
            raise ValueError("dpo_loss: nll_alpha > 0 needs chosen_tokens (completion token counts per pair)")
        nll = chosen_nll(policy_chosen, chosen_tokens)
        loss = loss + cfg.nll_alpha * nll
    return DpoLossOutput(
        loss=loss,
        per_pair=per_pair,
        nll=nll.detach(),
        chosen_rewards=(cfg.beta * rho_c).detach(),
        rejected_rewards=(cfg.beta * rho_r).detach(),
    )
