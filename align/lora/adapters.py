"""LoRA on `nn.Linear` (Hu et al. 2021), written here so the runtime needs no peft.

A wrapped projection computes
    y = x W^T + b + (alpha / r) * B (A dropout(x))        A: (r, in), B: (out, r)
with W and b the base layer's own Parameter objects (frozen, never copied: the wrapper registers the same tensors
under the same names, so the state dict keeps `...q_proj.weight` and only gains `...q_proj.lora_A.weight` and
`...q_proj.lora_B.weight`). A starts as peft's default (Kaiming-uniform, a = sqrt(5)) and B at zero, so the wrapped
model equals the base bitwise before the first step. The adapters are submodules of the layer that owns the
projection (a `MistralDecoderLayer`), so FSDP2's per-block `fully_shard` shards them with their block.

`merge` folds the adapters in for export (W' = W + (B @ A) * alpha / r, peft's order of operations), giving a plain
model that `save_checkpoint` publishes as an ordinary HF checkpoint; `save_adapter` writes the adapter alone in
peft's file layout (adapter_config.json + adapter_model.safetensors, keys `base_model.model.<module>.lora_A.weight`).
"""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from align.utils.fsio import publish_dir, staging_dir

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ENGINE_SYNCS = ("adapters", "merged")
PEFT_PREFIX = "base_model.model."  # peft's PeftModel -> LoraModel -> the base model's own names


@dataclass(frozen=True)
class LoraConfig:
    """[lora] table."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0  # on the adapter's input only (the base path sees x unchanged), as peft
    # a Linear is wrapped when its qualified name equals an entry or ends with "." + entry (peft's rule)
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    save_adapter: bool = False  # a stage also publishes the adapter alone, in peft's layout, under final/adapter/
    # how a sampler of the policy (GRPO/PPO rollouts, the in-loop Engine) follows it (align.lora.stage):
    # "adapters": the engine holds the base once and runs base(x) + (x A^T)(s B)^T, a sync moves the adapters only;
    # "merged": the engine holds a plain model and every sync sends W + s B A for every wrapped weight
    engine_sync: str = "adapters"

    def __post_init__(self):
        if not (isinstance(self.rank, int) and self.rank > 0):
            raise ValueError(f"LoraConfig.rank must be a positive integer, got {self.rank!r}")
        if not self.alpha > 0:
            raise ValueError(f"LoraConfig.alpha must be > 0, got {self.alpha!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LoraConfig.dropout must lie in [0, 1), got {self.dropout!r}")
        if not self.target_modules or not all(isinstance(t, str) and t for t in self.target_modules):
            raise ValueError(f"LoraConfig.target_modules must be non-empty module names, got {self.target_modules!r}")
        if self.engine_sync not in ENGINE_SYNCS:
            raise ValueError(f"LoraConfig.engine_sync must be one of {ENGINE_SYNCS}, got {self.engine_sync!r}")
        object.__setattr__(self, "target_modules", tuple(self.target_modules))

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


def lora_delta(a: torch.Tensor, b: torch.Tensor, scaling: float) -> torch.Tensor:
    """(out, in) update of one adapter, (B @ A) * alpha / r: peft's order of operations (merge is bitwise its)."""
    return (b @ a) * scaling


class LoraLinear(nn.Module):
    """A frozen `nn.Linear` plus a trainable low-rank update. Holds the base's weight/bias Parameters themselves."""

    def __init__(self, base: nn.Linear, cfg: LoraConfig):
        super().__init__()
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight  # the same Parameter object: no copy, same state-dict key
        self.bias = base.bias
        self.weight.requires_grad_(False)
        if self.bias is not None:
            self.bias.requires_grad_(False)
        self.scaling = cfg.scaling
        self.lora_dropout = nn.Dropout(cfg.dropout) if cfg.dropout > 0 else nn.Identity()
        kw = dict(bias=False, device=base.weight.device, dtype=base.weight.dtype)
        self.lora_A = nn.Linear(self.in_features, cfg.rank, **kw)
        self.lora_B = nn.Linear(cfg.rank, self.out_features, **kw)
        self.reset_adapter()

    @torch.no_grad()
    def reset_adapter(self) -> None:
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))  # peft's init_lora_weights=True
        nn.init.zeros_(self.lora_B.weight)  # so the wrapped layer starts equal to the base

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        base = F.linear(x, self.weight, self.bias)  # exactly nn.Linear's forward
        return base + self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling

    @torch.no_grad()
    def delta_weight(self) -> torch.Tensor:
        """(out, in): (B @ A) * alpha / r."""
        return lora_delta(self.lora_A.weight, self.lora_B.weight, self.scaling)

    def merged(self) -> nn.Linear:
        """A plain Linear holding W + delta as a new tensor (W itself is not modified: a reference model sharing
        the base weights stays the base)."""
        out = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                        device=self.weight.device, dtype=self.weight.dtype)
        with torch.no_grad():
            out.weight.copy_(self.weight + self.delta_weight())
            if self.bias is not None:
                out.bias.copy_(self.bias)
        return out


def _matches(name: str, targets: tuple[str, ...]) -> bool:
    return any(name == t or name.endswith("." + t) for t in targets)


def _shared_weights(model: nn.Module) -> set[int]:
    """ids of Parameters reachable under more than one name (tied embeddings / lm_head)."""
    seen: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        seen[id(p)] = seen.get(id(p), 0) + 1
    return {k for k, n in seen.items() if n > 1}


def apply_lora(model: nn.Module, cfg: LoraConfig) -> nn.Module:
    """Wrap every target Linear of `model` in place, freeze every other parameter; returns `model`.

    Raises ValueError when no Linear matches, when a target is already wrapped, or when a target's weight is tied
    to another parameter (merging it would silently untie the checkpoint)."""
    if any(isinstance(m, LoraLinear) for m in model.modules()):
        raise ValueError("apply_lora: the model already has LoRA adapters")
    shared = _shared_weights(model)
    _refuse_unsupported_targets(model, cfg.target_modules)
    targets = [(name, m) for name, m in model.named_modules()
               if isinstance(m, nn.Linear) and _matches(name, cfg.target_modules)]
    for name, linear in targets:
        if id(linear.weight) in shared:
            raise ValueError(f"apply_lora: {name}.weight is tied to another parameter; LoRA on it is not supported")
    for p in model.parameters():
        p.requires_grad_(False)
    for name, linear in targets:
        _set_submodule(model, name, LoraLinear(linear, cfg))
    return model


def _refuse_unsupported_targets(model: nn.Module, targets: tuple[str, ...]) -> None:
    """Every target must name nn.Linear modules only: a target that matches a module or parameter of another kind
    (OLMoE's experts are stacked 3-D parameters `mlp.experts.gate_up_proj` [E, 2I, d] / `mlp.experts.down_proj`
    [E, d, I], its router `mlp.gate` a Router) or nothing at all would leave part of what the config asked for
    silently unadapted (OLMoE with the default targets trained its attention only)."""
    linears = sorted({n.rpartition(".")[2] for n, m in model.named_modules() if isinstance(m, nn.Linear)})
    supported = [n for n in linears if n != "lm_head"] or linears
    hits = {t: [(n, m) for n, m in model.named_modules() if n and _matches(n, (t,))] for t in targets}
    for target in targets:  # first the wrong kinds (the more telling error), then the names that match nothing
        other = [(n, type(m).__name__) for n, m in hits[target] if not isinstance(m, nn.Linear)]
        other += [(n, f"a {tuple(p.shape)} parameter") for n, p in model.named_parameters()
                  if _matches(n, (target,))]
        if other:
            name, kind = other[0]
            raise ValueError(f"apply_lora: target module {target!r} matches {name} ({kind}), which is not an "
                             f"nn.Linear: LoRA here wraps nn.Linear only (per-expert adapters on {type(model).__name__}'s "
                             f"stacked expert weights are not supported); supported targets on this model: {supported}")
    for target in targets:
        if not hits[target]:
            raise ValueError(f"apply_lora: target module {target!r} matches no module of {type(model).__name__}; "
                             f"supported targets on this model: {supported}")


def _set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def lora_layers(model: nn.Module) -> dict[str, LoraLinear]:
    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLinear)}


def trainable_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """The (name, parameter) pairs the optimizer should see: after `apply_lora`, the adapters only."""
    return [(name, p) for name, p in model.named_parameters() if p.requires_grad]


def merge(model: nn.Module) -> nn.Module:
    """Replace every LoraLinear by a plain Linear with W + (B @ A) * alpha / r, in place; returns `model`, whose
    parameters are all trainable again (as a freshly loaded checkpoint) and whose state dict has the base keys only."""
    layers = lora_layers(model)
    if not layers:
        raise ValueError("merge: the model has no LoRA adapters")
    for name, layer in layers.items():
        _set_submodule(model, name, layer.merged())
    for p in model.parameters():
        p.requires_grad_(True)
    return model


ADAPTER_KEYS = (".lora_A.weight", ".lora_B.weight")  # a wrapped module's adapter tensors in its state dict


def adapter_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapter tensors under peft's saved key names (no adapter name: peft inserts ".default" on load)."""
    return peft_adapter_state(model.state_dict())


def peft_adapter_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter entries of a LoRA model's (full, e.g. gathered) state dict under peft's saved key names."""
    out = {f"{PEFT_PREFIX}{k}": v.detach().contiguous().cpu() for k, v in state.items() if k.endswith(ADAPTER_KEYS)}
    if not out:
        raise ValueError("adapter_state_dict: the model has no LoRA adapters")
    return out


def merge_state_dict(state: dict[str, torch.Tensor], scaling: float) -> dict[str, torch.Tensor]:
    """A LoRA model's (full) state dict as the plain model's: every `<m>.weight` with adapters becomes
    W + (B @ A) * scaling (new tensors, bitwise `merge`'s), the adapter entries are dropped, the rest is passed
    through (the same tensor objects). What a stage publishes and what a sampler of the plain model is sent."""
    out = {k: v for k, v in state.items() if not k.endswith(ADAPTER_KEYS)}
    for key in state:
        if key.endswith(ADAPTER_KEYS[0]):
            module = key[: -len(ADAPTER_KEYS[0])]
            a, b = state[key], state[module + ADAPTER_KEYS[1]]
            out[module + ".weight"] = out[module + ".weight"] + lora_delta(a, b, scaling)
    return out


def peft_adapter_config(cfg: LoraConfig, base_model: str | None = None) -> dict:
    """adapter_config.json as peft's LoraConfig writes it (the fields that change its loading; defaults otherwise)."""
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
            "r": cfg.rank, "lora_alpha": cfg.alpha, "lora_dropout": cfg.dropout,
            "target_modules": sorted(cfg.target_modules), "bias": "none", "fan_in_fan_out": False,
            "init_lora_weights": True, "use_rslora": False, "use_dora": False, "modules_to_save": None,
            "layers_to_transform": None, "layers_pattern": None, "rank_pattern": {}, "alpha_pattern": {},
            "inference_mode": True}


def save_adapter(model: nn.Module, cfg: LoraConfig, out_dir: str | os.PathLike,
                 base_model: str | None = None) -> Path:
    """Write the adapter alone in peft's layout at `out_dir`: staged, fsynced, published by rename."""
    return save_adapter_state(adapter_state_dict(model), cfg, out_dir, base_model)


def save_adapter_state(state: dict[str, torch.Tensor], cfg: LoraConfig, out_dir: str | os.PathLike,
                       base_model: str | None = None) -> Path:
    """`save_adapter` from tensors already under peft's key names (`peft_adapter_state` of a gathered state)."""
    final = Path(out_dir)
    staging = staging_dir(final)
    try:
        save_file(state, str(staging / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        (staging / ADAPTER_CONFIG).write_text(json.dumps(peft_adapter_config(cfg, base_model), indent=2) + "\n")
        return publish_dir(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
