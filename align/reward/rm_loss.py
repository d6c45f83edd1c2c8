"""Bradley-Terry reward-model loss as a pure function on per-pair scalar rewards.

Per preference pair i with rewards r_c = r(x, y_c), r_r = r(x, y_r) (the critic's score at each arm's last
non-padding token) and an optional margin m_i (how much better y_c is known to be; 0 when the data has none):

    l_i = -log sigmoid(r_c - r_r - m_i)                  Bradley-Terry (Ouyang et al. 2022, Llama 2's margin form)
    c_i = (r_c + r_r)^2                                  reward centering (Eisenstein et al. 2023): pins the
                                                         reward's free offset near 0 without changing the ranking
    loss = mean_i l_i + coef * mean_i c_i

Parity: `loss` equals TRL 1.16 RewardTrainer.compute_loss (which adds `center_rewards_coefficient * mean((r_c +
r_r)^2)` when that coefficient is set) on the same rewards and margins; tests/train/test_rm_loss_oracle.py calls
TRL's code to 1e-6. The seam's normalisation (a SUM over pairs divided by the window's pair count) makes the window
loss exactly this mean over the window's pairs."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class RmLossConfig:
    """[loss] table of the reward-model stage."""

    margin: float = 0.0  # m for every pair (a batch's own `margin` column, when present, replaces it)
    center_rewards_coefficient: float = 0.0  # coef of the centering term; 0: off (TRL: None)

    def __post_init__(self):
        if self.margin < 0:
            raise ValueError(f"margin must be >= 0 (chosen is preferred by at least m), got {self.margin}")
        if self.center_rewards_coefficient < 0:
            raise ValueError(f"center_rewards_coefficient must be >= 0, got {self.center_rewards_coefficient}")


@dataclass(frozen=True)
class RmLossOutput:
    loss: torch.Tensor  # scalar mean over the pairs, differentiable
    per_pair: torch.Tensor  # (P,) l_i + coef * c_i, differentiable (sums to P * loss)
    bt: torch.Tensor  # (P,) the Bradley-Terry term l_i alone, detached
    margins: torch.Tensor  # (P,) r_c - r_r, detached (> 0: the pair is ranked right)


def rm_loss(chosen: torch.Tensor, rejected: torch.Tensor, cfg: RmLossConfig,
            margin: torch.Tensor | None = None) -> RmLossOutput:
    """`chosen`, `rejected`: (P,) rewards; `margin`: optional (P,) per-pair margins (else `cfg.margin`)."""
    if chosen.shape != rejected.shape or chosen.dim() != 1:
        raise ValueError(f"rm_loss: chosen and rejected must be (P,) alike, got {tuple(chosen.shape)} and "
                         f"{tuple(rejected.shape)}")
    diff = chosen - rejected
    m = cfg.margin if margin is None else margin.to(diff.dtype)
    bt = -F.logsigmoid(diff - m)
    per_pair = bt + cfg.center_rewards_coefficient * (chosen + rejected) ** 2 if cfg.center_rewards_coefficient \
        else bt
    return RmLossOutput(loss=per_pair.mean(), per_pair=per_pair, bt=bt.detach(), margins=diff.detach())
