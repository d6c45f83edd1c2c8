"""Group-relative advantages: each sample's reward against the other samples of its own prompt.

For a group of G completions of one prompt with rewards r_1..r_G (mean mu, standard deviation sigma):
    scale "group_std":  A_k = (r_k - mu) / (sigma + eps)       GRPO (Shao et al. 2024); sigma is the population
                                                               std (ddof 0) unless `unbiased_std`
    scale "none":       A_k = (r_k - mu) / c                   Dr. GRPO (Liu et al. 2025): no per-question std, which
                                                               up-weights near-solved and near-hopeless questions;
                                                               c = `constant` (1 by default)
    scale "batch_std":  A_k = (r_k - mu) / (sigma_batch + eps)  centred per group, scaled by the std of all the
                                                               step's centred rewards (REINFORCE++-style)
A group whose rewards are all equal has A = 0 everywhere: no signal (dynamic sampling drops such groups).
Optionally clipped to [-clip, clip]. Then `negative_scale` lambda multiplies the negative advantages only:
    A_k <- A_k                 if A_k >= 0
    A_k <- lambda * A_k        if A_k < 0
lambda = 1 is plain GRPO (each group's advantages sum to 0); lambda < 1 leans on positive-sample reinforcement,
lambda = 0 is PSR alone (Zhu et al. 2025, "The Surprising Effectiveness of Negative Reinforcement in LLM
Reasoning": positive samples raise pass@1 / greedy accuracy, negative ones keep pass@k). A small policy that is
mostly wrong sees 7 wrong samples per right one, and their push-down can swamp what the right one teaches."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch


@dataclass(frozen=True)
class AdvantageConfig:
    """[advantage] table."""

    scale: Literal["group_std", "none", "batch_std"] = "group_std"
    constant: float = 1.0  # c of scale "none"
    eps: float = 1e-4
    unbiased_std: bool = False  # ddof 1 (TRL's torch.std default) instead of the population std
    clip: float | None = None  # |A| bound; None: no clipping
    negative_scale: float = 1.0  # lambda on negative advantages (1: GRPO; 0: positive samples only)

    def __post_init__(self):
        if not self.constant > 0:
            raise ValueError(f"AdvantageConfig.constant must be > 0, got {self.constant}")
        if self.eps < 0:
            raise ValueError(f"AdvantageConfig.eps must be >= 0, got {self.eps}")
        if self.clip is not None and not self.clip > 0:
            raise ValueError(f"AdvantageConfig.clip must be > 0 or absent, got {self.clip}")
        if not 0.0 <= self.negative_scale <= 1.0:
            raise ValueError(f"AdvantageConfig.negative_scale must lie in [0, 1], got {self.negative_scale}")


def group_advantages(rewards: torch.Tensor, cfg: AdvantageConfig = AdvantageConfig()) -> torch.Tensor:
    """rewards (P, G) -> advantages (P, G), float64 arithmetic (reward sums of many terms stay exact)."""
    if rewards.dim() != 2:
        raise ValueError(f"group_advantages: rewards must be (prompts, samples), got shape {tuple(rewards.shape)}")
    r = rewards.double()
    centred = r - r.mean(dim=1, keepdim=True)
    ddof = 1 if cfg.unbiased_std else 0
    if cfg.scale == "group_std":
        std = r.std(dim=1, keepdim=True, correction=ddof) if r.shape[1] > ddof else torch.zeros_like(r[:, :1])
        adv = centred / (std + cfg.eps)
    elif cfg.scale == "none":
        adv = centred / cfg.constant
    elif cfg.scale == "batch_std":
        std = centred.std(correction=ddof) if centred.numel() > ddof else centred.new_zeros(())
        adv = centred / (std + cfg.eps)
    else:
        raise ValueError(f"group_advantages: unknown scale {cfg.scale!r}")
    if cfg.clip is not None:
        adv = adv.clamp(-cfg.clip, cfg.clip)
    if cfg.negative_scale != 1.0:
        adv = torch.where(adv < 0, adv * cfg.negative_scale, adv)
    return adv.to(rewards.dtype if rewards.is_floating_point() else torch.float32)


def zero_variance(rewards: torch.Tensor) -> torch.Tensor:
    """(P, G) -> (P,) bool: groups whose rewards are all equal (every sample right, or every sample wrong)."""
    return (rewards == rewards[:, :1]).all(dim=1)
