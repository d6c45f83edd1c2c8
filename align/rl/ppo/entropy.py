"""Differentiable per-token entropy of the tempered policy, for PPO's entropy bonus (`[loss] entropy_coef` > 0).

align.rl.token_logprobs gives the entropy detached (a statistic for the tripwires). The bonus needs its gradient:
with z = h W^T / T and p = softmax(z), H = -sum_v p_v log p_v and dH/dz_v = -p_v (log p_v + H). Autograd forms it
through log_softmax; each chunk's (c, V) logits are recomputed in backward (torch.utils.checkpoint), so peak extra
memory stays a few (chunk, V) buffers, never (tokens, V)."""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint


def _chunk_entropy(h: torch.Tensor, weight: torch.Tensor, inv_temp: float) -> torch.Tensor:
    z = (h @ weight.t()).float() * inv_temp
    logp = torch.log_softmax(z, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def token_entropy(hidden: torch.Tensor, weight: torch.Tensor, temperature: float,
                  chunk_size: int = 1024) -> torch.Tensor:
    """(N,) entropies of softmax(hidden W^T / temperature), hidden (N, D); differentiable in hidden and weight."""
    if not temperature > 0:
        raise ValueError(f"token_entropy: temperature must be > 0, got {temperature}")
    parts = [checkpoint(_chunk_entropy, hidden[lo:lo + chunk_size], weight, 1.0 / float(temperature),
                        use_reentrant=False) for lo in range(0, hidden.shape[0], chunk_size)]
    return torch.cat(parts) if parts else hidden.new_zeros(0, dtype=torch.float32)
