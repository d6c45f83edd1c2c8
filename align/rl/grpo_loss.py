"""The GRPO policy loss as pure functions on per-token tensors (no model, no config object leaks in).

Notation, for completion token t of sequence i (all tensors (B, C): B sequences, C completion positions):
    m_it       1 where the token counts in the loss (a real completion token, not masked), else 0
    logp_it    log pi_theta(y_it | x_i, y_i<t) under the weights being trained, at the sampling temperature;
               the only differentiable input
    old_it     log pi_old: the TRAINING model's log-prob at the weights that generated the rollout (no grad)
    roll_it    log-prob the sampler reported for the token (the behaviour policy as the inference engine computed
               it: another kernel, maybe another precision)
    ref_it     log-prob under the frozen reference model
    A_i        the sequence's advantage (align.rl.advantages), broadcast over its tokens

Two ratios, two jobs:
    r_it   = exp(logp_it - old_it)                  policy ratio (token level), what the PPO clip bounds; after the
    s_i    = exp(sum_t m_it (logp_it - old_it) / |m_i|)   GSPO sequence-level ratio (geometric mean), a variant
    rho_it = exp(old_it - roll_it)                  train/infer importance weight: corrects for the sampler's
                                                    numerics differing from training's (truncated importance
                                                    sampling, "TIS"; Yao et al. 2025); == 1 exactly when the two
                                                    log-probs are equal. Sequence level: exp(sum_t m_it (...)).
Per-token objective (to minimise):
    l_it = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A) * w_it + beta * kl_it
    w_it = min(rho_it, rho_cap) (truncation), and 0 for an outlier token (rho outside [mask_low, mask_high])
    kl_it = exp(ref - logp) - (ref - logp) - 1       (k3 estimator of KL(pi_theta || pi_ref), unbiased, >= 0)
Asymmetric clip (DAPO "clip-higher"): eps_high > eps_low leaves room for low-probability tokens to grow. With
`dual_clip` the unclipped arm's ratio is capped too (TRL's `delta`: a bound on a negative-advantage token's pull).

Normalisation is explicit (`loss_sum` returns a SUM; `loss_units` says what it is divided by, over the whole
optimizer step and every rank, by the TrainModule seam):
    "token"     sum_it m l / sum_it m                    per token over the global batch (DAPO; TRL "dapo"/"bnpo")
    "sequence"  sum_i (sum_t m l / |m_i|) / B             mean over sequences of each sequence's token mean (the
                                                          original GRPO; TRL "grpo"); longer answers weigh less
    "constant"  sum_it m l / (B * L)                      L a constant (the max new tokens): no length bias
                                                          (Dr. GRPO; TRL "dr_grpo")"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

Normalisation = Literal["token", "sequence", "constant"]


@dataclass(frozen=True)
class GrpoLossConfig:
    """[loss] table of the GRPO stage."""

    ratio_level: Literal["token", "sequence"] = "token"  # "sequence": GSPO's length-normalised sequence ratio
    clip_low: float = 0.2  # eps_low: r is clipped below at 1 - clip_low
    clip_high: float = 0.28  # eps_high: r is clipped above at 1 + clip_high (DAPO clip-higher when > clip_low)
    dual_clip: float | None = None  # cap on r in the unclipped arm (TRL `delta`); None: off
    normalisation: Normalisation = "token"
    constant_length: int | None = None  # L of "constant"; None: the rollout's max_new_tokens
    kl_beta: float = 0.0  # weight of the k3 KL to the reference in the loss (0: no reference model is loaded)
    rho_level: Literal["token", "sequence"] = "token"
    rho_cap: float | None = 2.0  # TIS: w = min(rho, rho_cap); None: no truncation
    rho_mask_low: float | None = None  # tokens (sequences at sequence level) with rho below this get weight 0
    rho_mask_high: float | None = None  # ... or above this
    chunk_size: int = 1024  # completion tokens per logits chunk in the head
    head_dtype: Literal["float32", "bfloat16"] = "float32"  # the LM head's GEMM operands (logits stay fp32)
    fused: bool = True  # token-level ratio: gradients formed in forward (align.rl.fused_objective, 3 head GEMMs
    # instead of 4); false, or ratio_level "sequence": logits recomputed in backward (align.rl.token_logprobs)
    # The head's per-row passes (max, exp sums, entropy, d logp / d logits), in both heads and the reference scorer:
    # "native" in C (align.kernels.ce_rows, the SFT head's rows), "auto" = C on a CPU where it builds, "torch" =
    # torch ops. The default stays "torch" (configs/tiny/grpo.toml sets "auto"); PPO passes its own `[loss] kernel`
    # here, for its pi_old scoring, and to its training forward (align.rl.ppo.module): both must give the same bits.
    kernel: Literal["auto", "native", "torch"] = "torch"
    # "skip": rows whose loss and gradient are exactly 0 (advantage 0 without a KL term, or no loss token) stay out
    # of the training forward / backward, counted in the normaliser and the row statistics all the same
    # (align.rl.zero_rows); "train": every row goes through the forward, as before. Here and not in [shape]: the
    # rule is the loss's (PPO shares [shape] and trains every row).
    zero_gradient_rows: Literal["skip", "train"] = "skip"

    def __post_init__(self):
        problems = []
        if not 0.0 <= self.clip_low < 1.0:
            problems.append(f"clip_low must lie in [0, 1), got {self.clip_low}")
        if self.clip_high < 0.0:
            problems.append(f"clip_high must be >= 0, got {self.clip_high}")
        if self.dual_clip is not None and self.dual_clip <= 1.0 + self.clip_high:
            problems.append(f"dual_clip must exceed 1 + clip_high = {1 + self.clip_high}, got {self.dual_clip}")
        if self.kl_beta < 0:
            problems.append(f"kl_beta must be >= 0, got {self.kl_beta}")
        if self.rho_cap is not None and self.rho_cap <= 0:
            problems.append(f"rho_cap must be > 0 or absent, got {self.rho_cap}")
        if None not in (self.rho_mask_low, self.rho_mask_high) and self.rho_mask_low >= self.rho_mask_high:
            problems.append(f"rho_mask_low {self.rho_mask_low} must be below rho_mask_high {self.rho_mask_high}")
        if self.constant_length is not None and self.constant_length < 1:
            problems.append(f"constant_length must be >= 1 or absent, got {self.constant_length}")
        if self.chunk_size < 1:
            problems.append(f"chunk_size must be >= 1, got {self.chunk_size}")
        if problems:
            raise ValueError("GrpoLossConfig: " + "; ".join(problems))


def masked_sequence_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum_t m_it x_it per sequence, keeping a trailing axis: (B, C) -> (B, 1)."""
    return (x * mask).sum(-1, keepdim=True)


def policy_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor,
                 level: Literal["token", "sequence"] = "token") -> torch.Tensor:
    """r_it = exp(logp - old) per token (B, C); or GSPO's s_i = exp(mean_t over m of (logp - old)) as (B, 1)."""
    log_ratio = logp - old_logp
    if level == "token":
        return torch.exp(log_ratio)
    if level == "sequence":
        n = mask.sum(-1, keepdim=True).clamp(min=1.0)
        return torch.exp(masked_sequence_sum(log_ratio, mask) / n)
    raise ValueError(f"policy_ratio: level must be 'token' or 'sequence', got {level!r}")


def clipped_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, clip_low: float, clip_high: float,
                      dual_clip: float | None = None) -> torch.Tensor:
    """-min(r A, clip(r, 1 - clip_low, 1 + clip_high) A), elementwise; A (B,) broadcasts over the ratio's columns,
    A (B, C) or (B, 1) is taken as is (PPO's per-token advantages, GRPO's step credit).
    With `dual_clip`, r in the first arm is min(r, dual_clip) (bounds the pull of a token with A < 0)."""
    as_is = advantages.shape == ratio.shape or advantages.dim() == 2
    adv = (advantages if as_is else advantages.reshape(-1, 1)).to(ratio.dtype)
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    if dual_clip is not None:
        ratio = torch.clamp(ratio, max=dual_clip)
    return -torch.min(ratio * adv, clipped * adv)


@dataclass(frozen=True)
class TrainInferWeight:
    weight: torch.Tensor  # (B, C) or (B, 1): min(rho, cap), 0 where an outlier; no gradient
    rho: torch.Tensor  # the raw rho (before truncation and masking), same shape
    outlier: torch.Tensor  # bool, same shape: masked out for lying outside [mask_low, mask_high]


@torch.no_grad()
def train_infer_weight(old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor,
                       level: Literal["token", "sequence"] = "token", cap: float | None = None,
                       mask_low: float | None = None, mask_high: float | None = None) -> TrainInferWeight:
    """rho = exp(old - roll) (token level, (B, C)) or exp(sum_t m (old - roll)) (sequence level, (B, 1)); the
    weight is rho truncated at `cap` (TIS) with outliers (rho < mask_low or > mask_high) set to 0. Positions
    outside the mask get rho = 1 (their difference is taken as 0, so padding can never be an outlier)."""
    diff = (old_logp - rollout_logp) * mask
    if level == "sequence":
        diff = diff.sum(-1, keepdim=True)
    elif level != "token":
        raise ValueError(f"train_infer_weight: level must be 'token' or 'sequence', got {level!r}")
    rho = torch.exp(diff)
    outlier = torch.zeros_like(rho, dtype=torch.bool)
    if mask_low is not None:
        outlier |= rho < mask_low
    if mask_high is not None:
        outlier |= rho > mask_high
    weight = rho if cap is None else torch.clamp(rho, max=cap)
    return TrainInferWeight(weight.masked_fill(outlier, 0.0), rho, outlier)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi_theta || pi_ref) on tokens sampled from pi_theta:
    exp(ref - logp) - (ref - logp) - 1 (Schulman 2020); >= 0, and 0 exactly where logp == ref."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


def loss_sum(per_token: torch.Tensor, mask: torch.Tensor, normalisation: Normalisation) -> torch.Tensor:
    """This micro-batch's contribution to the loss numerator (see the module docstring); per_token (B, C) or
    (B, 1) broadcast over the mask. Divide by the step's global `loss_units` to get the loss."""
    per_token = per_token.expand_as(mask) if per_token.shape != mask.shape else per_token
    summed = (per_token * mask).sum(-1)  # (B,)
    if normalisation in ("token", "constant"):
        return summed.sum()
    if normalisation == "sequence":
        return (summed / mask.sum(-1).clamp(min=1.0)).sum()
    raise ValueError(f"loss_sum: normalisation must be 'token', 'sequence' or 'constant', got {normalisation!r}")


def loss_units(mask: torch.Tensor, normalisation: Normalisation, constant_length: int | None = None) -> float:
    """The denominator this micro-batch contributes: loss tokens ("token"), sequences ("sequence"), or
    sequences x L ("constant")."""
    if normalisation == "token":
        return float(mask.sum())
    if normalisation == "sequence":
        return float(mask.shape[0])
    if normalisation == "constant":
        if constant_length is None:
            raise ValueError("loss_units: normalisation 'constant' needs constant_length")
        return float(mask.shape[0] * constant_length)
    raise ValueError(f"loss_units: normalisation must be 'token', 'sequence' or 'constant', got {normalisation!r}")


@dataclass(frozen=True)
class PolicyTerms:
    per_token: torch.Tensor  # (B, C) or (B, 1): l_it before masking and normalisation (differentiable)
    ratio: torch.Tensor  # r (token) or s (sequence), detached
    weight: TrainInferWeight
    kl: torch.Tensor | None  # (B, C) k3 per token, detached; None without a reference


def policy_terms(logp: torch.Tensor, old_logp: torch.Tensor, rollout_logp: torch.Tensor, advantages: torch.Tensor,
                 mask: torch.Tensor, cfg: GrpoLossConfig, ref_logp: torch.Tensor | None = None) -> PolicyTerms:
    """l_it of the module docstring: the clipped surrogate, weighted by the train/infer weight, plus beta * k3."""
    ratio = policy_ratio(logp, old_logp, mask, cfg.ratio_level)
    surrogate = clipped_surrogate(ratio, advantages, cfg.clip_low, cfg.clip_high, cfg.dual_clip)
    w = train_infer_weight(old_logp, rollout_logp, mask, cfg.rho_level, cfg.rho_cap, cfg.rho_mask_low,
                           cfg.rho_mask_high)
    per_token = surrogate * w.weight
    kl = None
    if cfg.kl_beta > 0:
        if ref_logp is None:
            raise ValueError("policy_terms: kl_beta > 0 needs reference log-probs")
        kl_t = k3_kl(logp, ref_logp)
        per_token = per_token + cfg.kl_beta * kl_t
        kl = kl_t.detach()
    return PolicyTerms(per_token, ratio.detach(), w, kl)


@torch.no_grad()
def clip_fractions(ratio: torch.Tensor, advantages: torch.Tensor, cfg: GrpoLossConfig) -> tuple[torch.Tensor, ...]:
    """Where the clip binds: (low, high) bool masks, the ratio's shape. Low: r < 1 - eps_low with A < 0; high:
    r > 1 + eps_high with A > 0 (the only places the min picks the clipped arm and the gradient is cut). A: (N,) or
    (N, 1) per row, or (N, C) per token."""
    adv = advantages if advantages.dim() == 2 else advantages.reshape(-1, 1)
    return (ratio < 1.0 - cfg.clip_low) & (adv < 0), (ratio > 1.0 + cfg.clip_high) & (adv > 0)
