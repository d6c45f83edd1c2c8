"""Generalised advantage estimation (Schulman et al. 2016) and masked whitening, as pure functions.

For one response with per-token rewards r_t, critic values V_t and mask m_t (1 on response tokens; a row's tokens
are a contiguous run, so the first masked position after the run ends the episode):
    delta_t = r_t + gamma * m_{t+1} V_{t+1} - V_t                       (V after the last token is 0: terminal)
    A_t     = delta_t + gamma * lambda * m_{t+1} A_{t+1}                 (computed right to left)
    R_t     = A_t + V_t                                                  (the value target, "returns")
lambda = 1 gives A_t = sum_k gamma^k r_{t+k} - V_t (Monte-Carlo); lambda = 0 gives the one-step residual delta_t.
Positions outside the mask get A = R = 0.

A multi-turn completion (align.rl.environment) holds the environment's observation tokens between the policy's
turns: they are not the policy's actions, so the recursion runs over the policy's tokens only, as if the
observations were not there (`policy_columns` / `gather_columns` / `scatter_columns`: the policy's tokens moved to
the front of each row in order, the formulas above on that contiguous run, the results put back): a turn's last token
bootstraps from the value at the policy's next token, after the observation.

Whitening of x over the masked positions (TRL's `masked_whiten`: unbiased variance):
    mu = sum m x / sum m,   var = sum m (x - mu)^2 / (sum m - 1),   w = (x - mu) / sqrt(var + eps)  (+ mu unless
    `shift_mean`); masked positions outside stay 0. With several ranks, mu and var are over every rank's positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class GaeConfig:
    """[gae] table."""

    gamma: float = 1.0
    lam: float = 0.95
    whiten_advantages: bool = True
    negative_scale: float = 1.0  # factor on negative advantages after whitening (1: PPO; 0: positive tokens only,
    # as GRPO's [advantage] negative_scale)

    def __post_init__(self):
        for name in ("gamma", "lam", "negative_scale"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"GaeConfig.{name} must lie in [0, 1], got {getattr(self, name)!r}")


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float,
        lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """rewards, values, mask (B, T) -> (advantages, returns) (B, T), no gradient (the critic's values are targets).

    Float64 arithmetic: the right-to-left recursion accumulates T terms."""
    if not rewards.shape == values.shape == mask.shape or rewards.dim() != 2:
        raise ValueError(f"gae: rewards, values and mask must share one (B, T) shape, got {tuple(rewards.shape)}, "
                         f"{tuple(values.shape)}, {tuple(mask.shape)}")
    m = mask.double()
    r, v = rewards.detach().double() * m, values.detach().double() * m
    adv = torch.zeros_like(r)
    running = torch.zeros_like(r[:, 0])  # (B,) A_{t+1} m_{t+1}
    next_value = torch.zeros_like(r[:, 0])  # (B,) V_{t+1} m_{t+1}
    for t in range(r.shape[1] - 1, -1, -1):
        delta = r[:, t] + gamma * next_value - v[:, t]
        running = (delta + gamma * lam * running) * m[:, t]
        adv[:, t] = running
        next_value = v[:, t]
    returns = (adv + v) * m
    return adv.to(values.dtype), returns.to(values.dtype)


def policy_columns(mask: torch.Tensor) -> torch.Tensor:
    """(B, T) column order that moves each row's masked positions to its front, in order (a stable sort)."""
    return torch.sort((mask <= 0).to(torch.int8), dim=1, stable=True).indices


def gather_columns(x: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    return x.gather(1, order.to(x.device))


def scatter_columns(x: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """The inverse of `gather_columns`."""
    return torch.zeros_like(x).scatter_(1, order.to(x.device), x)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum m x / sum m over every axis (0 when the mask is empty)."""
    m = mask.to(x.dtype)
    return (x * m).sum() / m.sum().clamp(min=1.0)


def masked_var(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Unbiased variance of x over the mask; needs at least two masked positions."""
    n = mask.sum()
    if n < 2:
        raise ValueError(f"masked_var: needs at least 2 masked positions, got {int(n)}")
    centred = (x - masked_mean(x, mask)) * mask.to(x.dtype)
    return centred.square().sum() / (n - 1)


def whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8,
           reduce: Callable[[list[float]], torch.Tensor] | None = None) -> torch.Tensor:
    """(x - mu) / sqrt(var + eps) over the mask (mu added back unless shift_mean); 0 outside the mask.
    `reduce` (align.utils.dist.all_reduce_sum): mu and var over the masked positions of every rank's x (two
    float64 all-reduces: the sums, then the squared deviations from the global mean)."""
    if reduce is None:
        mu, var = masked_mean(x, mask), masked_var(x, mask)
    else:
        m = mask.to(x.dtype)
        total, n = reduce([float((x * m).sum()), float(m.sum())]).tolist()
        if n < 2:
            raise ValueError(f"whiten: needs at least 2 masked positions over all ranks, got {int(n)}")
        mu = torch.as_tensor(total / n, dtype=x.dtype)
        var = torch.as_tensor(float(reduce([float(((x - mu) * m).square().sum())])[0]) / (n - 1), dtype=x.dtype)
    out = (x - mu) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mu
    return out * mask.to(x.dtype)


def scale_negatives(adv: torch.Tensor, scale: float) -> torch.Tensor:
    """Negative entries of `adv` times `scale` (positive ones and zeros unchanged); `adv` itself when scale is 1."""
    return adv if scale == 1.0 else torch.where(adv < 0, adv * scale, adv)
