"""`TrainModule`: forward, loss, backward, clipping, the LR schedule and the optimizer step. The seam every stage
(SFT, DPO, GRPO) plugs into; the `Trainer` owns everything else (loop, accumulation window, checkpoints, resume,
stop decisions) and never sees a loss formula. A TrainModule never opens a checkpoint directory.

What a subclass supplies (the loss seam):
    loss(model, batch) -> LossOutput     runs INSIDE the wrapped forward (parallel.LossForward), so DDP / FSDP2 see
                                         it; returns the differentiable SUM over this micro-batch's loss units and
                                         detached statistics (`sums`) that the Trainer adds over the window and ranks
    loss_units(batch) -> float           how many units this micro-batch's loss sums over (SFT: label tokens,
                                         DPO: pairs); the Trainer totals them over the window and all ranks BEFORE
                                         the first backward
    log_metrics(sums) -> dict            turn the window's global sums into the logged numbers (loss = sum / units)
    extra_state() / load_extra_state()   module-private state that must survive resume (a tripwire baseline, an
                                         adaptive KL coefficient); plain tensors / numbers / lists / dicts only,
                                         since resume.pt is read with torch.load(weights_only=True)
                                         A part every rank holds alike (PPO's replicated critic) may be saved by
                                         rank 0 alone: another rank's extra state then names it under REPLICATED
                                         ({REPLICATED: [keys]}) and `resolve_replicated` fills it from rank 0's at
                                         resume, so the checkpoint holds one copy, not one per rank

Loss normalisation: each micro-batch's summed loss is scaled by world_size / global_units before backward. DDP and
FSDP2 average gradients over ranks, so the window's gradient is exactly the gradient of (sum of every loss unit on
every rank) / (number of units): one big batch, not a mean of per-micro-batch means (seed 003 names that bias).

A skipped step: `optim_step` returns False and changes nothing (no update, the schedule does not advance) when the
global gradient norm is non-finite or any rank saw a non-finite loss in the window; the decision is made from one
all-reduced quantity (grad_norm.global_grad_norm), so it is identical on every rank."""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from align.train.grad_norm import clip_grads_, global_grad_norm
from align.train.optim import OptimizerConfig, make_optimizer
from align.train.parallel import LossForward, ParallelConfig, grad_sync, wrap
from align.train.schedulers import SchedulerConfig, lr_multiplier
from align.utils.dist import device, is_rank0


@dataclass(frozen=True)
class AccumInfo:
    """Where a micro-batch sits in its accumulation window, and the window's global loss-unit count."""

    micro_index: int  # 0-based position in the window
    num_micro: int  # micro-batches per window on each rank
    global_units: float  # loss units in the whole window summed over all ranks
    world_size: int

    @property
    def is_last(self) -> bool:
        return self.micro_index == self.num_micro - 1


@dataclass
class LossOutput:
    loss: torch.Tensor  # differentiable scalar: SUM over this micro-batch's loss units
    sums: dict[str, torch.Tensor] = field(default_factory=dict)  # detached statistics, summed by the Trainer


@dataclass
class StepMetrics:
    sums: dict[str, torch.Tensor]  # this micro-batch's detached statistics (0-dim tensors, not yet synced)
    nonfinite: torch.Tensor  # 0-dim bool: the loss was NaN or inf


REPLICATED = "replicated_from_rank0"  # extra-state key: the keys this rank left to rank 0's copy


def resolve_replicated(ranks: list[dict], r: int) -> dict:
    """Rank `r`'s extra state from the saved per-rank states, its REPLICATED keys taken from rank 0's."""
    mine = dict(ranks[r])
    shared = mine.pop(REPLICATED, [])
    return {**mine, **{k: ranks[0][k] for k in shared}}


class StepOutcome(enum.Enum):
    """What `optim_step` did at a boundary. The Trainer counts SKIPPED towards the skip caps (exit 81); EMPTY is
    not a fault (the window held nothing to learn from, e.g. a GRPO batch of zero advantages) but, like SKIPPED,
    moves no weight: the history's `applied` column is 1 only for APPLIED (the weight-stall probe reads it)."""

    APPLIED = "applied"
    SKIPPED = "skipped"  # non-finite gradients or loss on some rank
    EMPTY = "empty"


@dataclass(frozen=True)
class TrainModuleConfig:
    """The [optimizer], [scheduler] and [parallel] tables a TrainModule is built from."""

    optimizer: OptimizerConfig = OptimizerConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    parallel: ParallelConfig = ParallelConfig()


def to_device(batch: dict, dev: torch.device) -> dict:
    return {k: v.to(dev, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}


class TrainModule:
    """Base class; subclasses implement `loss`, `loss_units` and (optionally) `log_metrics` / extra state."""

    def __init__(self, model: nn.Module, cfg: TrainModuleConfig, total_steps: int, seed: int = 0):
        self.model = model
        self.cfg = cfg
        self.total_steps = total_steps
        self.net = wrap(LossForward(model, self.loss), cfg.parallel)
        self.optimizer, self.banner = make_optimizer(model, cfg.optimizer, seed=seed)
        self.step = 0  # applied optimizer steps: the schedule's clock
        self.last: dict[str, float] = {}  # grad_norm, clip_coef, lr of the latest optim_step
        self._window_bad = torch.zeros((), dtype=torch.bool, device=device())

    # ------------------------------------------------------------------------------------------- the loss seam
    def loss(self, model: nn.Module, batch: dict) -> LossOutput:
        raise NotImplementedError

    def loss_units(self, batch: dict) -> float:
        raise NotImplementedError

    def log_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        return dict(sums)

    def extra_state(self) -> dict:
        return {}

    def load_extra_state(self, state: dict) -> None:
        if state:
            raise ValueError(f"{type(self).__name__} has no extra state but the checkpoint carries {sorted(state)}")

    # ------------------------------------------------------------------------------------------- the step
    def train_batch(self, batch: dict, accum: AccumInfo, bare: bool = False) -> StepMetrics:
        """Forward + backward of one micro-batch; gradients accumulate until `optim_step`. `bare`: the loss on the
        unwrapped model, outside DDP / FSDP2 (a micro-batch whose loss does not involve the wrapped model's
        parameters, e.g. PPO's critic-only warmup: the wrapper would wait for gradients that never come)."""
        self.net.train()
        batch = to_device(batch, device())
        scale = accum.world_size / accum.global_units if accum.global_units > 0 else 0.0
        with grad_sync(self.net, accum.is_last or self.cfg.parallel.sync_every_micro_batch):
            out = self.loss(self.model, batch) if bare else self.net(batch)
            (out.loss * scale).backward()
        nonfinite = ~torch.isfinite(out.loss.detach())
        self._window_bad |= nonfinite
        return StepMetrics(sums={k: v.detach() for k, v in out.sums.items()}, nonfinite=nonfinite)

    def optim_step(self) -> StepOutcome:
        """Clip and step (APPLIED), or skip (SKIPPED) when the gradients or any rank's window loss are non-finite."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        norm = global_grad_norm(params, local_nonfinite=bool(self._window_bad))
        mult = lr_multiplier(self.cfg.scheduler, self.step, self.total_steps)
        self.last = {"grad_norm": norm, "lr": self.cfg.optimizer.lr * mult, "clip_coef": 1.0}
        if not math.isfinite(norm):
            return StepOutcome.SKIPPED
        if self.cfg.optimizer.max_grad_norm is not None:
            self.last["clip_coef"] = clip_grads_(params, norm, self.cfg.optimizer.max_grad_norm)
        for group in self.optimizer.param_groups:
            group["lr"] = group["base_lr"] * mult
        self.optimizer.step()
        self.step += 1
        return StepOutcome.APPLIED

    def zero_grads(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self._window_bad.zero_()

    # ------------------------------------------------------------------------------------------- state
    def state_dict(self) -> dict:
        """This rank's optimizer state (DTensor shards as plain local tensors) and the schedule's step."""
        return {"optimizer": localize(self.optimizer.state_dict()), "step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        rewrap_dtensor_state(self.optimizer)
        self.step = int(state["step"])

    def full_model_state_dict(self) -> dict[str, torch.Tensor]:
        """Full (unsharded) CPU weights on rank 0, {} elsewhere. Collective under FSDP2: every rank must call it."""
        return full_state_dict(self.model)

    def load_model_state_dict(self, state: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy full weights into the (possibly sharded) model; every rank passes the same full tensors, as a dict or
        as (name, tensor) pairs streamed one at a time (a 7B resume then never holds more than one full tensor).
        A tied parameter is filled from whichever of its names arrives (HF files omit a tied lm_head)."""
        own = self.model.state_dict(keep_vars=True)
        leader: dict[str, str] = {}  # every name -> the first name of its parameter
        by_id: dict[int, str] = {}
        for name, t in own.items():
            leader[name] = by_id.setdefault(id(t), name)
        filled: set[str] = set()
        with torch.no_grad():
            for name, tensor in (state.items() if isinstance(state, Mapping) else state):
                if name not in leader:
                    raise KeyError(f"checkpoint weight {name!r} is not a parameter of {type(self.model).__name__}")
                if leader[name] not in filled:
                    _copy_full_into(own[leader[name]], tensor, name)
                    filled.add(leader[name])
        missing = sorted(set(by_id.values()) - filled)
        if missing:
            raise KeyError(f"checkpoint weights lack {missing[:3]} ({len(missing)} parameters)")


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """`model`'s full (unsharded) CPU weights on rank 0, {} elsewhere. Collective under FSDP2: every rank must call
    it. Gathered one tensor at a time, so no rank ever holds more than one full tensor beyond its shard."""
    out = {}
    for name, t in model.state_dict().items():
        if hasattr(t, "full_tensor"):
            t = t.full_tensor()
        if is_rank0():
            out[name] = t.detach().to("cpu", copy=True)
    return out


def local_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """This rank's shard of every weight (DTensors as their local tensors): a sharded model's per-rank state."""
    return localize(dict(model.state_dict()))


def load_local_state_dict(model: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Copy `local_state_dict`'s shards back into the (same world size, same sharding) model."""
    own = model.state_dict()
    if set(own) != set(state):
        raise KeyError(f"{type(model).__name__}: saved shards name {sorted(set(state) ^ set(own))[:3]} that do not "
                       f"match the model's weights")
    with torch.no_grad():
        for name, t in own.items():
            local = t.to_local() if hasattr(t, "to_local") else t
            if local.shape != state[name].shape:
                raise ValueError(f"{name}: saved shard {tuple(state[name].shape)}, this rank's {tuple(local.shape)}")
            local.copy_(state[name])


def _copy_full_into(target: torch.Tensor, src: torch.Tensor, name: str) -> None:
    if hasattr(target, "to_local"):  # DTensor: take this rank's shard of the full tensor
        from torch.distributed.tensor import distribute_tensor

        src = distribute_tensor(src.to(target.dtype), target.device_mesh, target.placements).to_local()
        target = target.to_local()
    if target.shape != src.shape:
        raise ValueError(f"{name}: checkpoint shape {tuple(src.shape)}, model {tuple(target.shape)}")
    target.detach().copy_(src)


def localize(obj):
    """Replace DTensors by their local shards (resume.pt must load with weights_only=True, same world size)."""
    if hasattr(obj, "to_local") and hasattr(obj, "placements"):
        return obj.to_local().detach().clone()
    if isinstance(obj, dict):
        return {k: localize(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [localize(v) for v in obj]
    return obj


def rewrap_dtensor_state(opt: torch.optim.Optimizer) -> None:
    """After loading local shards, turn state that belongs to a DTensor parameter back into DTensors."""
    from torch.distributed.tensor import DTensor

    if getattr(opt, "local_shard_state", False):  # adamw8bit keeps plain per-shard state by design
        return
    for group in opt.param_groups:
        for p in group["params"]:
            if not isinstance(p, DTensor):
                continue
            for key, value in opt.state.get(p, {}).items():
                if torch.is_tensor(value) and not isinstance(value, DTensor) and value.shape == p.to_local().shape:
                    opt.state[p][key] = DTensor.from_local(value, p.device_mesh, p.placements, run_check=False,
                                                           shape=p.shape, stride=p.stride())
