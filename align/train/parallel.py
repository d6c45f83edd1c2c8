"""Data parallelism for a `LossForward` unit: one process, DDP, or FSDP2 (`fully_shard` per decoder block).

Why the unit is "model + loss" and not the model: DDP prepares its reducer and FSDP2 unshards the root parameters
only for code that runs inside the wrapped module's `__call__`. A fused loss reads `lm_head.weight` directly (it
never calls `lm_head`), so the loss must run inside that forward or it would see a sharded DTensor (FSDP2) or
bypass the reducer (DDP).

Gradient sync only on the last micro-batch of an accumulation window: FSDP2 `set_requires_gradient_sync(False)`
(gradients accumulate unsharded and unreduced), DDP `no_sync()`. Mixed precision under FSDP2 is a policy: params
in `param_dtype` for compute, gradients reduced in `reduce_dtype`, the sharded fp32 master untouched. The root
unit does not cast its inputs: a batch may carry fp32 reference log-probs that must not be rounded to bf16."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Literal

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from align.model.checkpoint import DTYPES
from align.model.moe_ep import expert_shard_params
from align.utils.dist import device, is_distributed, world_size


@dataclass(frozen=True)
class ParallelConfig:
    """[parallel] table."""

    strategy: Literal["auto", "single", "ddp", "fsdp"] = "auto"  # auto: single with one rank, fsdp with several
    param_dtype: Literal["float32", "bfloat16"] = "float32"  # FSDP2 compute dtype of gathered params
    reduce_dtype: Literal["float32", "bfloat16"] = "float32"  # FSDP2 gradient reduce-scatter dtype
    reshard_after_forward: bool = True  # FSDP2: free gathered block params after forward (ZeRO-3) or keep (ZeRO-2)
    activation_checkpointing: bool = False  # recompute each decoder block in backward (non-reentrant)
    # Reduce gradients after every micro-batch instead of only the window's last. NOTE: skipping the reduce keeps
    # each rank's gradient unsharded until the window ends (FSDP2), i.e. a full bf16 gradient per GPU (14.5 GB for
    # 7B): where memory is short, sync every micro-batch and pay the extra reduce-scatters instead.
    sync_every_micro_batch: bool = False
    # Expert parallelism (align.model.moe_ep): ranks per EP group, each holding num_experts / N experts of every
    # MoE layer; 1 = off. Must divide the world size and num_experts. The expert shards stay out of DDP / FSDP2.
    expert_parallel: int = 1

    def __post_init__(self):
        if not isinstance(self.expert_parallel, int) or self.expert_parallel < 1:
            raise ValueError(f"parallel.expert_parallel must be an integer >= 1, got {self.expert_parallel!r}")

    def resolved_strategy(self, world: int) -> str:
        if self.strategy == "auto":
            return "single" if world == 1 else "fsdp"
        if self.strategy == "single" and world > 1:
            raise ValueError(f"parallel.strategy='single' with {world} ranks: use 'ddp' or 'fsdp'")
        return self.strategy


class LossForward(nn.Module):
    """`forward(batch) = loss_fn(model, batch)`: the module DDP / FSDP2 wrap (see the module docstring)."""

    def __init__(self, model: nn.Module, loss_fn: Callable):
        super().__init__()
        self.model = model
        self._loss_fn = loss_fn  # a bound method of the TrainModule; not a Module, so not a child

    def forward(self, batch: dict):
        return self._loss_fn(self.model, batch)


def decoder_blocks(model: nn.Module) -> list[nn.Module]:
    """The FSDP / activation-checkpoint units: `model.model.layers` (the model contract)."""
    trunk = getattr(model, "model", None)
    layers = getattr(trunk, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise TypeError(f"{type(model).__name__} has no .model.layers ModuleList to shard or checkpoint")
    return list(layers)


def _checkpoint_forward(block: nn.Module) -> None:
    """Recompute `block` in backward. Patches `forward` (not a wrapper module) so parameter names are unchanged."""
    inner = block.forward

    def forward(*args, **kwargs):
        return checkpoint(inner, *args, use_reentrant=False, **kwargs)

    block.forward = forward


def wrap(unit: LossForward, cfg: ParallelConfig) -> nn.Module:
    """Move `unit` to this rank's device and apply the configured strategy. Build the optimizer afterwards: FSDP2
    replaces parameters with sharded DTensors. A model on the meta device (fsdp only) is sharded, then each rank
    allocates its shard; the caller fills it (TrainModule.load_model_state_dict streams full tensors)."""
    strategy = cfg.resolved_strategy(world_size())
    if strategy != "single" and not is_distributed():
        raise ValueError(f"parallel.strategy={strategy!r} needs a process group (launch with torchrun)")
    # A model built on the meta device (no rank ever allocates the full model) is sharded first, then each rank
    # allocates only its shard (to_empty); its weights are uninitialised until the caller streams them in
    # (TrainModule.load_model_state_dict, a resume).
    on_meta = any(p.is_meta for p in unit.parameters())
    if on_meta and strategy != "fsdp":
        raise ValueError(f"a model built on the meta device needs parallel.strategy = 'fsdp', got {strategy!r}")
    if not on_meta:
        unit.to(device())
    # expert-parallel shards differ across ranks: neither averaged (DDP) nor sharded (FSDP2) with the rest
    ignored = expert_shard_params(unit.model)
    if cfg.activation_checkpointing:
        for block in decoder_blocks(unit.model):
            _checkpoint_forward(block)
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [device().index] if device().type == "cuda" else None
        if ignored:
            names = {id(p): n for n, p in unit.named_parameters()}
            DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(unit, [names[id(p)] for p in ignored])
        return DistributedDataParallel(unit, device_ids=ids)  # the model has no buffers to sync
    if strategy == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = dict(param_dtype=DTYPES[cfg.param_dtype], reduce_dtype=DTYPES[cfg.reduce_dtype])
        skip = set(ignored) or None
        for block in decoder_blocks(unit.model):
            fully_shard(block, mp_policy=MixedPrecisionPolicy(**mp), reshard_after_forward=cfg.reshard_after_forward,
                        ignored_params=skip)
        fully_shard(unit, mp_policy=MixedPrecisionPolicy(**mp, cast_forward_inputs=False), ignored_params=skip)
        if on_meta:
            unit.to_empty(device=device())
            unit.model.tie_weights()
    return unit


def grad_sync(net: nn.Module, sync: bool):
    """Context for one micro-batch's forward + backward: reduce gradients across ranks only when `sync`."""
    if hasattr(net, "set_requires_gradient_sync"):  # FSDP2
        net.set_requires_gradient_sync(sync)
        return contextlib.nullcontext()
    if hasattr(net, "no_sync") and not sync:  # DDP
        return net.no_sync()
    return contextlib.nullcontext()
