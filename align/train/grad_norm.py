"""Global gradient norm and clipping that every rank computes identically, one process or many, DDP or FSDP2.

A sharded gradient (an FSDP2 DTensor) contributes the squares of its local shard, summed over ranks; a replicated
gradient (DDP, one process) contributes its squares once, since every rank holds the same values. The norm decides
whether a step is skipped, so it must be the same number on every rank: a rank-local NaN (a non-finite loss on one
rank whose gradient happened to stay finite) is folded into the same reduce, and the verdict comes out identical.

A rank-split parameter (`mark_rank_split`: an expert-parallel shard, align.model.moe_ep) holds different values on
the ranks of its EP group, each slice on `replicas` ranks: its squares join the sharded sum divided by `replicas`,
so the one all-reduce counts every expert shard exactly once and clipping sees all of them.

NOTE: every rank must call `global_grad_norm` at the same point: with a process group it issues one all-reduce."""

from __future__ import annotations

import math
from typing import Iterable

import torch

from align.utils.dist import all_reduce_sum, is_distributed


SPLIT_ATTR = "_align_split_replicas"


def mark_rank_split(param: torch.Tensor, replicas: int) -> None:
    """`param` differs across ranks and each of its values lives on `replicas` ranks (see the module docstring)."""
    setattr(param, SPLIT_ATTR, int(replicas))


def _is_dtensor(t: torch.Tensor) -> bool:
    return hasattr(t, "to_local") and hasattr(t, "placements")


def _grads(params: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    return [p.grad for p in params if p.grad is not None]


def _sq_sum(tensors: list[torch.Tensor]) -> float:
    if not tensors:
        return 0.0
    norms = torch._foreach_norm([t.float() if t.dtype != torch.float32 else t for t in tensors], 2.0)
    return float(torch.stack([n.double() ** 2 for n in norms]).sum())


def global_grad_norm(params: Iterable[torch.Tensor], local_nonfinite: bool = False) -> float:
    """L2 norm of all gradients of `params` across ranks; NaN on every rank if any rank flagged `local_nonfinite`."""
    params = [p for p in params if p.grad is not None]
    sharded = [p.grad.to_local() for p in params if _is_dtensor(p.grad)]
    split: dict[int, list[torch.Tensor]] = {}
    replicated = []
    for p in params:
        if not _is_dtensor(p.grad):
            replicas = getattr(p, SPLIT_ATTR, None)
            (replicated if replicas is None else split.setdefault(replicas, [])).append(p.grad)
    sharded_sq = _sq_sum(sharded) + sum(_sq_sum(grads) / replicas for replicas, grads in split.items())
    flag = 1.0 if local_nonfinite else 0.0
    if is_distributed():
        sharded_sq, flag = all_reduce_sum([sharded_sq, flag]).tolist()
    if flag > 0:
        return math.nan
    return math.sqrt(sharded_sq + _sq_sum(replicated))


def clip_grads_(params: Iterable[torch.Tensor], total_norm: float, max_norm: float) -> float:
    """Scale gradients so their global norm is at most `max_norm`; return the coefficient applied (<= 1)."""
    coef = min(1.0, max_norm / (total_norm + 1e-6))
    if coef < 1.0:
        grads = [g.to_local() if _is_dtensor(g) else g for g in _grads(params)]
        torch._foreach_mul_(grads, coef)
    return coef
