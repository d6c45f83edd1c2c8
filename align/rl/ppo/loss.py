"""PPO's loss terms (Schulman et al. 2017) as pure per-token functions; mean over the mask's tokens.

With ratio rho_t = exp(logp_t - old_logp_t), advantages A_t, values V_t, the rollout's values V_old_t, returns R_t
and the clip ranges eps (policy) and c (value):
    policy:   L_pi = mean_t max(-A_t rho_t, -A_t clip(rho_t, 1 - eps, 1 + eps))        (clipped surrogate)
    value:    L_V  = 1/2 mean_t max((V_t - R_t)^2, (V_old_t + clip(V_t - V_old_t, -c, c) - R_t)^2)
    entropy:  L_H  = -coef * mean_t H_t                                                 (a bonus: lowers the loss)
Each returns the loss and the fraction of masked tokens where the clipped arm was the one taken. The `*_per_token`
forms are the unreduced terms (the PPO TrainModule sums them over a micro-batch; the Trainer divides by the step's
global token count).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from align.rl.ppo.gae import masked_mean
from align.rl.grpo_loss import clipped_surrogate, policy_ratio


@dataclass(frozen=True)
class PpoLossConfig:
    """[loss] table of PPO."""

    clip: float = 0.2  # eps of the policy ratio
    value_clip: float = 0.2  # c: how far V may move from the rollout's values before its loss stops moving it
    value_coef: float = 0.1
    entropy_coef: float = 0.0  # > 0: the entropy's gradient is formed by align.rl.ppo.entropy (one more head pass)
    chunk_size: int = 1024  # completion tokens per logits chunk in the head
    head_dtype: Literal["float32", "bfloat16"] = "float32"  # the LM head's GEMM operands (logits stay fp32)
    # "skip": rows whose every loss token has advantage 0 (the wrong samples under [gae] negative_scale = 0) skip
    # the policy's forward and backward (the critic still trains on them): the same gradient (policy_rows);
    # "train": every row goes through the policy
    zero_gradient_rows: Literal["skip", "train"] = "skip"
    # the head's row passes (align.kernels.fused_ce.use_native), in the training forward and the pi_old scoring
    # alike, so that the two agree bit for bit: "torch" (GRPO's default; the recipe PPO's gains were measured
    # with), "native" in C, "auto" = C on a CPU where it builds, else torch
    kernel: Literal["auto", "native", "torch"] = "torch"

    def __post_init__(self):
        for name in ("clip", "value_clip"):
            if not getattr(self, name) > 0:
                raise ValueError(f"PpoLossConfig.{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("value_coef", "entropy_coef"):
            if getattr(self, name) < 0:
                raise ValueError(f"PpoLossConfig.{name} must be >= 0, got {getattr(self, name)!r}")
        if self.chunk_size < 1:
            raise ValueError(f"PpoLossConfig.chunk_size must be >= 1, got {self.chunk_size!r}")
        if self.kernel not in ("auto", "native", "torch"):
            raise ValueError(f"PpoLossConfig.kernel must be 'auto', 'native' or 'torch', got {self.kernel!r}")
        if self.zero_gradient_rows not in ("skip", "train"):
            raise ValueError(f"PpoLossConfig.zero_gradient_rows must be 'skip' or 'train', got "
                             f"{self.zero_gradient_rows!r}")


def policy_per_token(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                     clip: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, T) each -> (per-token surrogate, 1 where the clipped arm was taken, the detached ratio)."""
    ratio = policy_ratio(logp, old_logp, None)
    per_token = clipped_surrogate(ratio, advantages, clip, clip)
    clipped = (per_token > -advantages * ratio).to(logp.dtype)  # the clipped arm is strictly larger there
    return per_token, clipped.detach(), ratio.detach()


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) each -> (L_pi, clip fraction)."""
    per_token, clipped, _ = policy_per_token(logp, old_logp, advantages, clip)
    return masked_mean(per_token, mask), masked_mean(clipped, mask)


def value_per_token(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                    value_clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) each -> (1/2 max(plain, clipped) per token, 1 where the clipped arm was taken)."""
    clipped_values = old_values + torch.clamp(values - old_values, -value_clip, value_clip)
    plain, clipped = (values - returns).square(), (clipped_values - returns).square()
    return 0.5 * torch.max(plain, clipped), (clipped > plain).to(values.dtype).detach()


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               value_clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) each -> (L_V, clip fraction)."""
    per_token, clipped = value_per_token(values, old_values, returns, value_clip)
    return masked_mean(per_token, mask), masked_mean(clipped, mask)


def entropy_bonus(entropy: torch.Tensor, mask: torch.Tensor, coef: float) -> torch.Tensor:
    """(B, T) per-token entropies -> -coef * their masked mean."""
    return -coef * masked_mean(entropy, mask)


def policy_rows(batch: dict, loss: PpoLossConfig, ppo) -> torch.Tensor | None:
    """Row indices of a micro-batch that the policy must see, or None for all of them.

    Why exact: the policy's per-token loss is max(-A_t r_t, -A_t clip(r_t)) (0 for A_t = 0 and any finite r_t) plus,
    only when configured, an entropy bonus or a KL term in the loss (`ppo`: PpoConfig), which act on every token;
    with neither, a row whose advantages are 0 on every loss token adds exactly 0 to the loss and its gradient.
    A micro-batch with no such row still forwards one row (its shortest; gradient 0), so every rank runs one
    policy forward and backward per micro-batch (DDP's all-reduce and FSDP2's gathers need the same count)."""
    if loss.entropy_coef > 0 or (ppo.kl_in == "loss" and ppo.kl_beta > 0):
        return None
    live = ((batch["token_advantages"] != 0) & (batch["loss_mask"] != 0)).any(1)
    if bool(live.all()):
        return None
    if not bool(live.any()):
        return batch["completion_mask"].sum(1).argmin().reshape(1)
    return live.nonzero().squeeze(1)
