"""OLMoE checkpoints: the strict `config.json` reader and the weight layouts.

In memory the experts are fused 3-D parameters (`mlp.experts.gate_up_proj` (E, 2I, d), `mlp.experts.down_proj`
(E, d, I)); on disk they are the hub's per-expert matrices (`mlp.experts.<e>.gate_proj.weight` (I, d),
`up_proj.weight` (I, d), `down_proj.weight` (d, I)), the layout of allenai/OLMoE-1B-7B and the one transformers
5's `save_pretrained` writes (it fuses on load and splits on save). `to_hub_layout` splits a state dict,
`hub_targets` gives the loader one view of the fused parameter per file key (so reading stays streaming and
strict: every key, shape and dtype is checked before a byte is read), `fuse_hub_pairs` fuses a streamed file.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import torch

from align.exceptions import CheckpointError
from align.model.hf_config import IGNORED_KEYS, ConfigSpec
from align.model.olmoe import OlmoeConfig

# transformers' OlmoeConfig defaults, for keys a config.json omits
OLMOE_HF_DEFAULTS = {
    "vocab_size": 50304, "hidden_size": 2048, "intermediate_size": 2048, "num_hidden_layers": 16,
    "num_attention_heads": 16, "num_key_value_heads": None, "head_dim": None, "max_position_embeddings": 4096,
    "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "sliding_window": None,
    "bos_token_id": None, "eos_token_id": 50279, "pad_token_id": 1, "initializer_range": 0.02,
    "num_experts": 64, "num_experts_per_tok": 8, "norm_topk_prob": False, "router_aux_loss_coef": 0.01,
}
OLMOE_REQUIRED = {
    "hidden_act": ("silu",), "attention_dropout": (0, 0.0), "attention_bias": (False,), "clip_qkv": (None,),
    "rope_scaling": (None,), "quantization_config": (None,),
}
OLMOE_SPEC = ConfigSpec(
    OlmoeConfig, "olmoe", OLMOE_HF_DEFAULTS, IGNORED_KEYS | {"output_router_logits"}, OLMOE_REQUIRED,
    written={"hidden_act": "silu", "attention_dropout": 0.0, "attention_bias": False, "clip_qkv": None,
             "output_router_logits": False},
    aliases={"num_local_experts": "num_experts"}, not_written=("head_dim", "sliding_window"))

_FUSED = re.compile(r"^(.*\.mlp\.experts)\.(gate_up_proj|down_proj)$")
_HUB = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def _hub_pieces(prefix: str, kind: str, fused: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """(file key, view of `fused`) for every expert slice of one fused parameter."""
    for e in range(fused.shape[0]):
        if kind == "down_proj":
            yield f"{prefix}.{e}.down_proj.weight", fused[e]
        else:
            inter = fused.shape[1] // 2
            yield f"{prefix}.{e}.gate_proj.weight", fused[e, :inter]
            yield f"{prefix}.{e}.up_proj.weight", fused[e, inter:]


def _split(named: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for key, t in named.items():
        m = _FUSED.match(key)
        if m is None:
            out[key] = t
        else:
            out.update(_hub_pieces(m.group(1), m.group(2), t))
    return out


def to_hub_layout(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Fused state dict -> the hub's per-expert keys (views: nothing is copied)."""
    return _split(state)


def hub_targets(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Model parameters -> {file key: tensor to fill}; the per-expert keys are views into the fused parameters."""
    return _split(params)


def fuse_hub_pairs(pairs: Iterable[tuple[str, torch.Tensor]], cfg: OlmoeConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """Stream of (file key, tensor) in the hub layout -> the fused layout. Non-expert tensors pass through; a
    layer's two fused parameters are yielded as soon as all of its experts arrived (files store layers in order,
    so about one layer's experts are held at a time)."""
    pending: dict[str, dict[tuple[int, str], torch.Tensor]] = {}
    for key, t in pairs:
        m = _HUB.match(key)
        if m is None:
            yield key, t
            continue
        prefix, e, kind = m.group(1), int(m.group(2)), m.group(3)
        if e >= cfg.num_experts:
            raise CheckpointError(f"OLMoE checkpoint: {key} names expert {e}; the config has {cfg.num_experts}")
        pieces = pending.setdefault(prefix, {})
        pieces[(e, kind)] = t
        if len(pieces) == 3 * cfg.num_experts:
            yield from _fuse(prefix, pending.pop(prefix), cfg.num_experts)
    for prefix, pieces in pending.items():
        yield from _fuse(prefix, pieces, cfg.num_experts)  # raises: naming what is missing


def _fuse(prefix: str, pieces: dict[tuple[int, str], torch.Tensor],
          experts: int) -> Iterator[tuple[str, torch.Tensor]]:
    missing = [f"{prefix}.{e}.{k}.weight" for e in range(experts) for k in ("gate_proj", "up_proj", "down_proj")
               if (e, k) not in pieces]
    if missing:
        raise CheckpointError(f"OLMoE checkpoint: expert weights missing: {missing[:6]}"
                              f"{' ...' if len(missing) > 6 else ''}")
    yield f"{prefix}.gate_up_proj", torch.stack(
        [torch.cat([pieces[(e, "gate_proj")], pieces[(e, "up_proj")]]) for e in range(experts)])
    yield f"{prefix}.down_proj", torch.stack([pieces[(e, "down_proj")] for e in range(experts)])
