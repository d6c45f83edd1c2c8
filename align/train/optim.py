"""The one place a config's `[optimizer]` table becomes an optimizer, its param groups and its banner.

Param groups: weight decay applies to matrices of the trunk and head; by default not to norm weights, biases and
embeddings (decaying a norm gain or an embedding row toward zero is a regulariser nobody asked for; OLMo-core and
nanochat make the same split). Each exemption is a config switch. A tied LM head is the embedding and follows it.

Optimizers are registered by name (`OPTIMIZERS`), so another module may add one (an offloading AdamW) without
touching this file; an unknown name is a ConfigError listing the registered ones."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from align.registry import Registry
from align.train.adamw8bit import AdamW8bit
from align.train.offload_adamw import OffloadAdamW

OPTIMIZERS: Registry[Callable[..., torch.optim.Optimizer]] = Registry("optimizer")


@dataclass(frozen=True)
class OptimizerConfig:
    """[optimizer] table."""

    # a registered optimizer: "adamw" (torch), "adamw8bit" (8-bit moments, ~2 B/param) or "offload_adamw" (fp32
    # master + moments in host memory, 12 B/param there; the device keeps the parameters in the model's dtype)
    name: str = "adamw"
    lr: float = 3e-4  # peak learning rate; the schedule multiplies it
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.0  # decoupled (AdamW) decay for the decayed group
    decay_norms: bool = False  # apply weight decay to norm gains (1-D weights)
    decay_biases: bool = False
    decay_embeddings: bool = False  # also covers a tied LM head
    max_grad_norm: float | None = 1.0  # global clip of the gradient norm (pre-clip norm is logged); None: no clip
    min_8bit_numel: int = 4096  # adamw8bit: smaller tensors keep fp32 moments

    def __post_init__(self):
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be > 0 or absent, got {self.max_grad_norm}")


@OPTIMIZERS.register("adamw")
def _adamw(groups, cfg: OptimizerConfig, seed: int) -> torch.optim.Optimizer:
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay,
                             fused=_cpu_fused_ok(groups) or None)


def _cpu_fused_ok(groups) -> bool:
    """torch's fused AdamW for plain CPU tensors. NOTE: on a CPU torch defaults to the per-tensor loop, whose
    temporaries (sqrt, div of every moment) cost 16.6 ms per step of the tiny model against 4.5 ms fused (one thread,
    docs/MEASUREMENTS.md); CUDA keeps torch's default (foreach) and DTensor shards keep theirs."""
    params = [p for g in groups for p in g["params"]]
    return bool(params) and all(type(p) is nn.Parameter and p.device.type == "cpu" for p in params)


@OPTIMIZERS.register("adamw8bit")
def _adamw8bit(groups, cfg: OptimizerConfig, seed: int) -> torch.optim.Optimizer:
    return AdamW8bit(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay,
                     min_8bit_numel=cfg.min_8bit_numel, seed=seed)


@OPTIMIZERS.register("offload_adamw")
def _offload_adamw(groups, cfg: OptimizerConfig, seed: int) -> torch.optim.Optimizer:
    return OffloadAdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay)


def _exempt_ids(model: nn.Module, cfg: OptimizerConfig) -> set[int]:
    """ids of parameters that get no weight decay under `cfg`."""
    exempt: set[int] = set()
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            is_embedding = isinstance(module, nn.Embedding)
            is_bias = name == "bias"
            is_norm = not is_embedding and not is_bias and p.ndim < 2
            if ((is_embedding and not cfg.decay_embeddings) or (is_bias and not cfg.decay_biases)
                    or (is_norm and not cfg.decay_norms)):
                exempt.add(id(p))
    return exempt


def param_groups(model: nn.Module, cfg: OptimizerConfig) -> list[dict]:
    """[decayed, not decayed] groups of the trainable parameters (each parameter once, tied ones included once)."""
    exempt = _exempt_ids(model, cfg)
    decay, no_decay = [], []
    for p in model.parameters():  # deduplicated: a tied head appears once, as the embedding
        if p.requires_grad:
            (no_decay if id(p) in exempt else decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay, "name": "decay"},
              {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"}]
    return [g for g in groups if g["params"]]


def _numel(p: torch.Tensor) -> int:
    return p.numel()  # a DTensor reports its global size


def make_optimizer(model: nn.Module, cfg: OptimizerConfig, seed: int = 0) -> tuple[torch.optim.Optimizer, str]:
    """Build the optimizer named by `cfg.name` over `model`'s param groups; return it with a one-line banner."""
    groups = param_groups(model, cfg)
    opt = OPTIMIZERS.get(cfg.name)(groups, cfg, seed)
    for g in opt.param_groups:
        g["base_lr"] = cfg.lr  # the schedule multiplies this; `lr` is overwritten before every step
    parts = [f"{g['name']}: {len(g['params'])} tensors / {sum(_numel(p) for p in g['params']) / 1e6:.3f}M "
             f"(wd {g['weight_decay']})" for g in opt.param_groups]
    clip = f"clip {cfg.max_grad_norm}" if cfg.max_grad_norm is not None else "no clip"
    banner = f"optimizer {cfg.name} lr {cfg.lr} betas {tuple(cfg.betas)} eps {cfg.eps} {clip}; " + "; ".join(parts)
    return opt, banner
