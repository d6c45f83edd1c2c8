"""`MoETrainModule`: the MoE objective on the TrainModule seam (seed 000 "Mixture of experts", seed 003 2.3).

The model returns `RouterStats`; this module owns what is done with them. Nothing in the Trainer knows a router.

- The loss adapter is unchanged: `loss(model, batch)` runs the base module's loss on a proxy of the model that
  asks for `return_router_stats=True` (only while gradients are on, so a `no_grad` reference forward is never
  counted) and keeps the stats.
- Window buffer: per micro-batch, one packed all-reduce (SUM over ranks) of the detached stats, added to a
  buffer that lives for one accumulation window (reset by `zero_grads`).
- Global-scope load balance ("global"): f (the dispatch shares) comes from the buffer, P stays this rank's
  differentiable prob sum. The Trainer scales every micro-batch's loss by world / global_units and the gradient
  reduction averages over ranks, so the aux term is multiplied by global_units and normalised by the window's
  token count, extrapolated from the micro-batches seen so far (n_buf * num_micro / (m + 1)): at the window's last
  micro-batch f and the token count are exact, and the window's gradient is the gradient of one aux loss over
  the whole global batch in the limit of f settled. "micro": each micro-batch's own f and tokens (ablation).
- Router z-loss: the same scale, over the global token count.
- Defaults: load balance 0.01 and z-loss 0.001 for pretraining-type stages, 0 for SFT, DPO and GRPO (a
  pretrained router already balances its pretraining distribution, and narrow post-training data legitimately
  skews expert use; DPO's and GRPO's objectives are differences of log-probabilities, to which a balance term
  would add a gradient unrelated to the preference/reward). None means the stage default; a number overrides.
- The reported loss is the CE alone (`sums` are the base loss's), comparable with dense runs; the aux term enters
  the differentiable loss only, so a non-finite aux value makes the loss non-finite and the Trainer skips/halts.
- Telemetry: `moe/*` columns from the last completed window in every history row (`self.last`).
- `RouterCollapseTripwire` (a Trainer callback, armed by thresholds) halts on dead experts or MaxVio.
- Expert parallelism (`ep_groups`, from `[parallel] expert_parallel`; align.model.moe_ep): the constructor shards
  the experts before the base wraps the model and builds the optimizer, and `optim_step` finalizes the shards'
  gradients (replicate-group sum, 1/W) before the norm, clipping and the step, so no caller can skip it; the
  shards are marked rank-split, so the global norm counts each once. Checkpoints stay the non-EP ones:
  `full_model_state_dict` gathers the shards over the EP group, `load_model_state_dict` slices full tensors, and
  the optimizer state records its `expert_parallel`; a resume under another ep value reshards the experts' moments
  (one all-gather per tensor), so a run may resume across ep values at the same world size.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist
from torch import nn

from align.model.family import family_of_model
from align.model.moe import LossConvention, RouterStats, expert_load_metrics, load_balancing_loss, router_z_loss
from align.model.moe_ep import (ExpertParallel, apply_expert_parallel, expert_parallel_groups, expert_parallel_of,
                                expert_shard_params, expert_slices, finalize_expert_grads, gather_full_experts,
                                moe_blocks)
from align.train.grad_norm import mark_rank_split
from align.train.callbacks import Callback
from align.train.train_module import AccumInfo, LossOutput, StepMetrics, StepOutcome, TrainModule
from align.utils.dist import all_reduce_sum

PRETRAIN_STAGES = ("pretrain", "proxy")
PRETRAIN_DEFAULTS = (0.01, 0.001)  # (load balance, z-loss) for pretraining-type stages
METRIC_KEYS = ("moe/lb_loss", "moe/z_loss", "moe/max_vio", "moe/max_vio_layer", "moe/utilization", "moe/frac_dead",
               "moe/dead_experts_max", "moe/dead_experts_max_layer", "moe/load_entropy", "moe/router_entropy")


@dataclass(frozen=True)
class MoeAuxConfig:
    """The [moe_aux] table."""

    load_balance: float | None = None  # None: the stage default
    z_loss: float | None = None
    convention: LossConvention = "switch"
    scope: Literal["global", "micro"] = "global"
    # router-collapse tripwire (RouterCollapseTripwire), armed by either threshold; None: not armed
    collapse_max_dead_fraction: float | None = None
    collapse_max_vio: float | None = None

    def coefficients(self, stage: str) -> tuple[float, float]:
        lb, z = PRETRAIN_DEFAULTS if stage in PRETRAIN_STAGES else (0.0, 0.0)
        return (lb if self.load_balance is None else float(self.load_balance),
                z if self.z_loss is None else float(self.z_loss))


class _StatsProxy(nn.Module):
    """The model, as the base loss sees it: forwards ask for router stats while gradients are on, and keep them."""

    def __init__(self, model: nn.Module, sink: list):
        super().__init__()
        self.inner = model
        self._sink = sink

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("inner"), name)

    def _call(self, fn, *args, **kwargs):
        if not torch.is_grad_enabled():
            return fn(*args, **kwargs)
        out, stats = fn(*args, return_router_stats=True, **kwargs)
        self._sink.append(stats)
        return out

    def forward(self, *args, **kwargs):
        return self._call(self.inner, *args, **kwargs)

    def forward_hidden(self, *args, **kwargs):
        return self._call(self.inner.forward_hidden, *args, **kwargs)


def moe_module(base: type[TrainModule]) -> type[TrainModule]:
    """`base` (SftTrainModule, DpoTrainModule, ...) with the MoE objective; its loss formula is untouched."""

    class _MoE(MoETrainModule, base):
        pass

    _MoE.__name__ = _MoE.__qualname__ = f"MoE{base.__name__}"
    return _MoE


def build_train_module(base: type[TrainModule], model: nn.Module, *args, moe_aux: MoeAuxConfig, stage: str,
                       **kwargs) -> TrainModule:
    """`base(model, *args, **kwargs)`, with the MoE objective when the model's family has routers; expert-parallel
    when the TrainModuleConfig's `parallel.expert_parallel` > 1 (collective: creates the process groups)."""
    wrap = FAMILY_MODULES.get(family_of_model(model).name)
    cfg = next((a for a in (*args, kwargs.get("cfg")) if hasattr(a, "parallel")), None)
    ep = cfg.parallel.expert_parallel if cfg is not None else 1
    if wrap is None:
        if ep > 1:
            raise ValueError(f"parallel.expert_parallel = {ep} needs an MoE model; {type(model).__name__} "
                             f"(family {family_of_model(model).name}) has no experts")
        return base(model, *args, **kwargs)
    ep_groups = expert_parallel_groups(ep) if ep > 1 else None
    return wrap(base)(model, *args, moe_aux=moe_aux, stage=stage, ep_groups=ep_groups, **kwargs)


class MoETrainModule(TrainModule):
    """Mixin over a concrete TrainModule (use `moe_module(SftTrainModule)`); extra constructor kwargs:
    `moe_aux` (MoeAuxConfig), `stage` (the stage name the defaults are chosen by) and `ep_groups` (expert
    parallelism: align.model.moe_ep.expert_parallel_groups; None = every expert on every rank)."""

    def __init__(self, *args, moe_aux: MoeAuxConfig = MoeAuxConfig(), stage: str = "sft",
                 ep_groups: ExpertParallel | None = None, **kwargs):
        self.ep_groups = ep_groups
        if ep_groups is not None:  # NOTE: before the base wraps the model (DDP/FSDP2) and builds the optimizer
            model = args[0] if args else kwargs["model"]
            if expert_parallel_of(model) is None:
                apply_expert_parallel(model, ep_groups)
            for p in expert_shard_params(model):
                mark_rank_split(p, ep_groups.replicas)
        self.moe_aux = moe_aux
        self.lb_coef, self.z_coef = moe_aux.coefficients(stage)
        self._stats: list[RouterStats] = []
        self._buffer: RouterStats | None = None
        self._accum: AccumInfo | None = None
        self._moe_last = {k: math.nan for k in METRIC_KEYS}
        super().__init__(*args, **kwargs)
        if ep_groups is not None:
            e = self.model.config.num_experts
            self.banner += (f"; expert_parallel {ep_groups.ep} x {ep_groups.replicas} replica(s): "
                            f"{e // ep_groups.ep} of {e} experts per rank")

    # ------------------------------------------------------------------------------------------- the loss seam
    def loss(self, model: nn.Module, batch: dict) -> LossOutput:
        self._stats.clear()
        out = super().loss(_StatsProxy(model, self._stats), batch)
        if not self._stats:
            return out
        stats = self._stats[0]
        for more in self._stats[1:]:
            stats = stats + more
        return LossOutput(out.loss + self._aux(stats), out.sums)

    def _aux(self, stats: RouterStats) -> torch.Tensor:
        flat = stats.totals()
        reduced = all_reduce_sum(flat).to(device=flat.device, dtype=flat.dtype)
        window = RouterStats.from_totals(reduced, stats.num_layers, stats.num_experts, stats.top_k)
        self._buffer = window if self._buffer is None else self._buffer + window
        accum = self._accum
        if accum is None or self.lb_coef == 0 and self.z_coef == 0:
            return stats.prob_sums.sum() * 0.0
        units, world = accum.global_units, accum.world_size
        if self.moe_aux.scope == "global":
            f_from = self._buffer
            tokens = self._buffer.tokens * accum.num_micro / (accum.micro_index + 1)
            # this rank's P over the window's (estimated) global token count; x world/units by the Trainer, /world
            # by the gradient mean -> multiply by units here
            scale = units
        else:
            f_from, tokens, scale = stats, stats.tokens, units / (world * accum.num_micro)
        local = RouterStats(stats.counts, stats.prob_sums, stats.z_sums, tokens, stats.top_k, stats.entropy_sums)
        aux = self.lb_coef * load_balancing_loss(local, self.moe_aux.convention, dispatch_from=f_from)
        aux = aux + self.z_coef * router_z_loss(local)
        return scale * aux

    def train_batch(self, batch: dict, accum: AccumInfo) -> StepMetrics:
        self._accum = accum
        try:
            return super().train_batch(batch, accum)
        finally:
            self._accum = None

    # ------------------------------------------------------------------------------------------- the boundary
    def optim_step(self) -> StepOutcome:
        if self.ep_groups is not None:
            finalize_expert_grads(self.model, self.ep_groups)
        outcome = super().optim_step()
        if self._buffer is not None:
            self._moe_last = window_metrics(self._buffer, self.moe_aux.convention)
        self.last.update(self._moe_last)
        return outcome

    def zero_grads(self) -> None:
        super().zero_grads()
        self._buffer = None

    # ------------------------------------------------------------------------------------------- EP state
    @property
    def expert_parallel(self) -> int:
        return 1 if self.ep_groups is None else self.ep_groups.ep

    def full_model_state_dict(self) -> dict[str, torch.Tensor]:
        out = super().full_model_state_dict()
        if self.ep_groups is not None:
            out.update(gather_full_experts(self.model, self.ep_groups))  # the shards' [E/ep] copies replaced
        return out

    def load_model_state_dict(self, state: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> None:
        cuts = expert_slices(self.model)
        pairs = state.items() if isinstance(state, Mapping) else state
        super().load_model_state_dict((n, t[cuts[n]] if n in cuts else t) for n, t in pairs)

    def state_dict(self) -> dict:
        return dict(super().state_dict(), expert_parallel=self.expert_parallel)

    def load_state_dict(self, state: dict) -> None:
        saved = int(state.get("expert_parallel", 1))
        if saved != self.expert_parallel:
            state = dict(state, optimizer=self._reshard_moments(state["optimizer"], saved))
        super().load_state_dict(state)

    def _reshard_moments(self, opt_state: dict, saved: int) -> dict:
        """Optimizer state written under expert_parallel `saved` -> this module's layout. Rank r of the old layout
        held experts [(r % saved) * E/saved, ...): the ranks 0..saved-1 together hold all of them. Collective."""
        index = {id(p): i for i, p in enumerate(p for g in self.optimizer.param_groups for p in g["params"])}
        params = dict(self.model.named_parameters())
        e = self.model.config.num_experts
        old_n, cuts = e // saved, expert_slices(self.model)
        state = {i: dict(v) for i, v in opt_state["state"].items()}
        for block_name, _ in moe_blocks(self.model):
            for name in (f"{block_name}.experts.gate_up_proj", f"{block_name}.experts.down_proj"):
                entry = state.get(index[id(params[name])], {})
                for key in sorted(entry):
                    value = entry[key]
                    if not torch.is_tensor(value) or value.dim() == 0:
                        continue
                    if value.shape[0] != old_n:
                        raise ValueError(f"optimizer state {key!r} of {name} has shape {tuple(value.shape)}, not an "
                                         f"[E/ep = {old_n}, ...] expert shard: it cannot be resharded from "
                                         f"expert_parallel {saved} to {self.expert_parallel}")
                    full = value
                    if saved > 1:
                        parts = [torch.empty_like(value) for _ in range(dist.get_world_size())]
                        dist.all_gather(parts, value.contiguous())
                        full = torch.cat(parts[:saved])
                    entry[key] = full[cuts.get(name, slice(None))].clone()
        return dict(opt_state, state=state)


def window_metrics(window: RouterStats, convention: LossConvention) -> dict[str, float]:
    """The `moe/*` history columns of one window's global stats (exact values, no gradient). router_entropy: the
    mean entropy of the tokens' router distributions over log E (1: the router cannot tell experts apart).
    Per layer (so a collapse in one layer is not averaged away): max_vio_layer, the layer of the worst MaxVio;
    dead_experts_max, the most dead experts in one layer, and dead_experts_max_layer, that layer (-1: none dead)."""
    load = expert_load_metrics(window)
    return {"moe/lb_loss": float(load_balancing_loss(window.detach(), convention)),
            "moe/z_loss": float(router_z_loss(window.detach())), "moe/max_vio": load["max_vio"],
            "moe/max_vio_layer": float(load["max_vio_layer"]), "moe/utilization": load["utilization"],
            "moe/frac_dead": load["dead_experts"] / (window.num_layers * window.num_experts),
            "moe/dead_experts_max": float(load["dead_experts_max"]),
            "moe/dead_experts_max_layer": float(load["dead_experts_max_layer"]),
            "moe/load_entropy": load["load_entropy"],
            "moe/router_entropy": float((window.entropy() / window.tokens).mean()) / math.log(max(window.num_experts, 2))}


class RouterCollapseTripwire(Callback):
    """Halt (exit 80) when the window's dead-expert fraction or MaxVio exceeds its threshold (None: not armed).
    The metrics come from all-reduced stats, so every rank reaches the same verdict."""

    name = "router_collapse"

    def __init__(self, max_dead_fraction: float | None = None, max_vio: float | None = None):
        self.max_dead_fraction, self.max_vio = max_dead_fraction, max_vio

    def observe(self, trainer, metrics: dict) -> str | None:
        dead, vio = metrics.get("moe/frac_dead", math.nan), metrics.get("moe/max_vio", math.nan)
        if self.max_dead_fraction is not None and dead > self.max_dead_fraction:
            return f"router collapse: {dead:.3f} of experts received no token (limit {self.max_dead_fraction})"
        if self.max_vio is not None and vio > self.max_vio:
            return f"router collapse: MaxVio {vio:.3f} over the limit {self.max_vio}"
        return None


FAMILY_MODULES = {"olmoe": moe_module}  # family name (align.model.family) -> how its TrainModules are built


def moe_callbacks(aux: MoeAuxConfig) -> list[Callback]:
    """The Trainer callbacks a stage's [moe_aux] arms (none by default). Harmless on a dense model: without moe/*
    columns the tripwire reads NaN, which never exceeds a threshold."""
    if aux.collapse_max_dead_fraction is None and aux.collapse_max_vio is None:
        return []
    return [RouterCollapseTripwire(aux.collapse_max_dead_fraction, aux.collapse_max_vio)]
