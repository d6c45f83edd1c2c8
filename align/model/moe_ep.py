"""Expert parallelism (issue 24; seed 000 "Expert parallelism"): each rank of an EP group holds E/ep of a layer's
experts and the tokens travel to them by all-to-all, instead of every rank holding (or FSDP-gathering) all E.

Layout. World W = R x ep. EP groups are `ep` adjacent ranks ([0..ep-1], [ep..2ep-1], ...); EP rank p holds global
experts [p*E/ep, (p+1)*E/ep). The R ranks that hold the same shard (p, p+ep, p+2ep, ...) form a replicate group.
Everything that is not an expert (attention, norms, embeddings, lm_head, the router) stays replicated over all W
ranks and is reduced (or FSDP2-sharded) as without EP; `expert_shard_params` names what must stay out of that.

One block on this rank's N tokens (the router is replicated, so routing, RouterStats and every aux loss are the
non-EP model's):

    route + stable sort by global expert id      (SparseMoeBlock, unchanged)   -> x_sorted (N*k, d), counts (E,)
    count all-to-all (equal split)               [ep, 2 + E/ep] int64: call serial, row width, rows per expert
    row all-to-all (dropless, split sizes)       -> rows of every source, source-ascending, expert-major inside
    regroup                                      -> expert-major, source-ascending (a permutation)
    local experts through the same backend       (Experts.forward on E/ep experts)
    inverse permutation, reverse all-to-all      -> y_sorted (N*k, d) in this rank's own sorted order
    unsort + fixed-order combine                 (SparseMoeBlock, unchanged)

Why bitwise: expert e receives exactly the rows, in exactly the order, that one process sees when it stable-sorts
the rank-ordered concatenation of all tokens (source rank ascending, token order inside a source), so every expert
GEMM has the same operands; every other step is a row move (no arithmetic). No collective accumulates anything.
Backward of a row all-to-all is the reverse all-to-all with swapped splits (`_AllToAllRows`).

Deadlocks closed: a rank that receives zero rows still issues both all-to-alls forward and backward (`_no_rows`
ties the empty output to the received rows and to the local weights, which also gives exact-zero weight grads
instead of None). A desynchronised collective stream (a rank one layer or one micro-batch ahead) is reported by
the count exchange's serial / width check and the split-size checks, not by an allocator error or a hang.

Gradient scale: a shard's gradient arrives summed over its EP group; `finalize_expert_grads` sums over the
replicate group and multiplies by 1/W, the scale every replicated parameter gets from the data-parallel mean.
Order of operations: build model -> `apply_expert_parallel` -> optimizer -> DDP / FSDP2 of the rest.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from align.model.moe import Experts, SparseMoeBlock
from align.utils.dist import all_reduce_tensors_, packable_grads

_HEADER = 2  # count-message columns before the per-expert counts: call serial, row width


@dataclass(frozen=True)
class ExpertParallel:
    """This rank's place in the W = R x ep layout and the two process groups it belongs to."""

    ep: int  # ranks per EP group
    world: int
    rank: int
    ep_group: Any  # ProcessGroup of the ep adjacent ranks that together hold all experts
    replicate_group: Any | None  # ProcessGroup of the R ranks holding this rank's shard (None when R == 1)

    @property
    def replicas(self) -> int:
        return self.world // self.ep

    @property
    def ep_rank(self) -> int:
        return self.rank % self.ep

    def local_experts(self, num_experts: int) -> tuple[int, int]:
        """[first, end) of the global expert ids this rank holds."""
        if num_experts % self.ep:
            raise ValueError(f"expert parallelism: num_experts ({num_experts}) must be divisible by "
                             f"expert_parallel ({self.ep})")
        n = num_experts // self.ep
        return self.ep_rank * n, (self.ep_rank + 1) * n


def expert_parallel_groups(ep: int) -> ExpertParallel:
    """Collective over the world: create every EP group and every replicate group (torch requires each rank to
    create every group, in the same order) and return this rank's."""
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(f"expert_parallel = {ep} needs a process group (launch with torchrun)")
    world, me = dist.get_world_size(), dist.get_rank()
    if ep < 1 or world % ep:
        raise ValueError(f"expert_parallel = {ep} must be >= 1 and divide the world size ({world})")
    replicas = world // ep
    ep_group = rep_group = None
    for r in range(replicas):
        ranks = list(range(r * ep, (r + 1) * ep))
        group = dist.new_group(ranks)
        if me in ranks:
            ep_group = group
    if replicas > 1:
        for p in range(ep):
            ranks = list(range(p, world, ep))
            group = dist.new_group(ranks)
            if me in ranks:
                rep_group = group
    return ExpertParallel(ep, world, me, ep_group, rep_group)


def _check_splits(rows: int, splits: list[int], what: str) -> None:
    if rows != sum(splits):
        raise RuntimeError(f"expert-parallel all-to-all ({what}): {rows} rows but split sizes {splits} sum to "
                           f"{sum(splits)}; the ranks' collective streams are out of step")


def _all_to_all_rows(x: torch.Tensor, send: list[int], recv: list[int], group, what: str) -> torch.Tensor:
    _check_splits(x.shape[0], send, what)
    out = x.new_empty((sum(recv), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv, input_split_sizes=send, group=group)
    return out


class _AllToAllRows(torch.autograd.Function):
    """Rows to ranks by split sizes; backward is the reverse all-to-all with the splits swapped (exact: no
    arithmetic). Every rank runs it forward and backward, whatever its row counts."""

    @staticmethod
    def forward(ctx, x, send: list[int], recv: list[int], group, what: str):
        ctx.send, ctx.recv, ctx.group, ctx.what = send, recv, group, what
        return _all_to_all_rows(x, send, recv, group, what)

    @staticmethod
    def backward(ctx, grad):
        return _all_to_all_rows(grad, ctx.recv, ctx.send, ctx.group, ctx.what + " backward"), None, None, None, None


def _no_rows(x_local: torch.Tensor, experts: Experts) -> torch.Tensor:
    """The (0, d) output of a rank that received no row, tied to the received rows (so backward still issues the
    dispatch's reverse all-to-all) and to the local weights (so their grads are exact zeros, not None)."""
    tie = (experts.gate_up_proj.sum() + experts.down_proj.sum()) * 0
    return x_local * 0 + tie


@dataclass(frozen=True)
class _Plan:
    send: list[int]  # rows this rank sends to each EP rank
    recv: list[int]  # rows this rank receives from each EP rank
    regroup: torch.Tensor  # received (source-major) row -> expert-major order
    ungroup: torch.Tensor  # the inverse permutation
    local_counts: torch.Tensor  # (E/ep,) rows per local expert


class ExpertShard(Experts):
    """The local E/ep experts of one block (same parameter names as `Experts`: `gate_up_proj`, `down_proj`, now
    [E/ep, ...]); forward takes this rank's rows sorted by GLOBAL expert id and the (E,) counts, and returns their
    outputs in the same order, the experts having run wherever they live."""

    def __init__(self, full: Experts, groups: ExpertParallel, num_experts: int, layer: int):
        nn.Module.__init__(self)
        first, end = groups.local_experts(num_experts)
        self.gate_up_proj = nn.Parameter(full.gate_up_proj.detach()[first:end].clone(),
                                         requires_grad=full.gate_up_proj.requires_grad)
        self.down_proj = nn.Parameter(full.down_proj.detach()[first:end].clone(),
                                      requires_grad=full.down_proj.requires_grad)
        self.backend = full.backend
        self.groups, self.num_experts, self.first, self.layer = groups, num_experts, first, layer
        self.serial = 0  # forward calls of this block: the same on every rank of a healthy stream
        self.received_rows = 0  # rows the local experts got in the latest forward (load telemetry, tests)

    def __deepcopy__(self, memo):
        # NOTE: a copy (an in-loop engine's, a reference model's) would hold E/ep experts and exchange rows over this
        # rank's process groups: wrong or a hang far from here, so it is refused at the copy
        raise TypeError(f"an expert-parallel model holds {self.gate_up_proj.shape[0]} of {self.num_experts} experts "
                        "per rank and cannot be copied: copy it before apply_expert_parallel, or build the copy "
                        "from the TrainModule's full_model_state_dict() ([inloop_eval] is not supported with EP)")

    def forward(self, x_sorted: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        plan = self._plan(counts, x_sorted.shape[-1])
        group = self.groups.ep_group
        received = _AllToAllRows.apply(x_sorted, plan.send, plan.recv, group, f"layer {self.layer} dispatch")
        x_local = received.index_select(0, plan.regroup)
        self.received_rows = x_local.shape[0]
        if x_local.shape[0]:
            y_local = super().forward(x_local, plan.local_counts)
        else:
            y_local = _no_rows(x_local, self)
        y_back = y_local.index_select(0, plan.ungroup)
        return _AllToAllRows.apply(y_back, plan.recv, plan.send, group, f"layer {self.layer} return")

    def _plan(self, counts: torch.Tensor, width: int) -> _Plan:
        """Equal-split all-to-all of the count matrix (one host sync), then the regroup permutation."""
        ep, n_local = self.groups.ep, self.num_experts // self.groups.ep
        self.serial += 1
        per_dest = counts.to(torch.int64).view(ep, n_local)
        header = per_dest.new_tensor([self.serial, width]).expand(ep, _HEADER)
        message = torch.cat([header, per_dest], dim=1).contiguous()
        got = torch.empty_like(message)
        dist.all_to_all_single(got, message, group=self.groups.ep_group)
        host = torch.cat([per_dest.sum(1), got.flatten()]).tolist()
        send, table = host[:ep], [host[ep + s * (_HEADER + n_local):ep + (s + 1) * (_HEADER + n_local)]
                                  for s in range(ep)]
        for source, row in enumerate(table):
            if row[:_HEADER] != [self.serial, width] or min(row[_HEADER:], default=0) < 0:
                raise RuntimeError(
                    f"expert-parallel layer {self.layer}: EP rank {self.groups.ep_rank} is at call {self.serial} "
                    f"with rows of width {width}, EP rank {source} sent call {row[0]} width {row[1]} counts "
                    f"{row[_HEADER:]}; the ranks' collective streams are out of step")
        recv_counts = got[:, _HEADER:]  # (ep sources, n_local experts)
        recv = [sum(row[_HEADER:]) for row in table]
        # received rows are source-major (expert-ascending inside a source); the experts want expert-major,
        # source-ascending: the stable order of key = expert * ep + source
        segment = torch.repeat_interleave(torch.arange(ep * n_local, device=counts.device), recv_counts.flatten())
        key = (segment % n_local) * ep + torch.div(segment, n_local, rounding_mode="floor")
        regroup = torch.argsort(key, stable=True)
        ungroup = torch.empty_like(regroup)
        ungroup[regroup] = torch.arange(regroup.numel(), device=regroup.device)
        return _Plan(send, recv, regroup, ungroup, recv_counts.sum(0))


def moe_blocks(model: nn.Module) -> Iterator[tuple[str, SparseMoeBlock]]:
    for name, module in model.named_modules():
        if isinstance(module, SparseMoeBlock):
            yield name, module


def apply_expert_parallel(model: nn.Module, groups: ExpertParallel) -> nn.Module:
    """Keep only this rank's experts of every SparseMoeBlock (new Parameters: build the optimizer afterwards) and
    set `block.ep`. Every rank must start from the same full weights (same seed, or the same checkpoint)."""
    blocks = list(moe_blocks(model))
    if not blocks:
        raise ValueError(f"expert parallelism: {type(model).__name__} has no SparseMoeBlock")
    for layer, (name, block) in enumerate(blocks):
        if block.ep is not None:
            raise ValueError(f"expert parallelism: {name} is already sharded")
        block.experts = ExpertShard(block.experts, groups, block.num_experts, layer)
        block.ep = groups
    return model


def expert_shard_params(model: nn.Module) -> list[nn.Parameter]:
    """The expert-parallel shards of `model` (empty without EP): kept out of DDP / FSDP2 of the rest."""
    return [p for _, block in moe_blocks(model) if block.ep is not None for p in block.experts.parameters()]


def finalize_expert_grads(model: nn.Module, groups: ExpertParallel) -> None:
    """Put every expert shard's gradient on the scale of the replicated parameters' data-parallel mean.

    A shard's gradient arrives summed over its EP group (the dispatch backward delivers every source rank's
    contribution); the replicated parameters get (1/W) * sum over all W ranks. So: sum over the replicate group
    (one all-reduce of all shards packed, when R > 1), then divide by W. Skipped, the experts would train at
    `ep` times the learning rate with no error. Collective over the replicate group."""
    grads = packable_grads(expert_shard_params(model))  # NOTE: None (zeros) means no forward ran on this rank
    if not grads:
        return
    if groups.replicas > 1:
        all_reduce_tensors_(grads, group=groups.replicate_group)
    torch._foreach_div_(grads, float(groups.world))


def _shards(model: nn.Module) -> Iterator[tuple[str, ExpertShard, str]]:
    """(state-dict name, shard module, parameter name) of every expert-parallel parameter, in model order."""
    for name, block in moe_blocks(model):
        if block.ep is not None:
            for pname in ("gate_up_proj", "down_proj"):
                yield f"{name}.experts.{pname}", block.experts, pname


def gather_full_experts(model: nn.Module, groups: ExpertParallel) -> dict[str, torch.Tensor]:
    """The full [E, ...] expert tensors (the file a non-EP run writes), on CPU on rank 0, {} elsewhere. Collective
    over the EP group that holds rank 0 (the other groups hold copies and skip it); one tensor at a time."""
    out: dict[str, torch.Tensor] = {}
    if groups.rank >= groups.ep:
        return out
    for key, shard, pname in _shards(model):
        local = getattr(shard, pname).detach().contiguous()
        parts = [torch.empty_like(local) for _ in range(groups.ep)]
        dist.all_gather(parts, local, group=groups.ep_group)
        if groups.rank == 0:
            out[key] = torch.cat(parts).to("cpu")
    return out


def expert_slices(model: nn.Module) -> dict[str, slice]:
    """State-dict name -> the dim-0 slice of the full [E, ...] tensor this rank holds ({} without EP)."""
    return {key: slice(shard.first, shard.first + getattr(shard, pname).shape[0])
            for key, shard, pname in _shards(model)}


def expert_parallel_of(model: nn.Module) -> ExpertParallel | None:
    for _, block in moe_blocks(model):
        return block.ep
    return None
