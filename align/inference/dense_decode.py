"""The dense (SwiGLU) block of the engine's decode step (`DenseMlp`, align.inference.fused_layers' "dense" entry)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from align.inference.row_invariance import chunked
from align.kernels import linear as native_linear
from align.lora import decode as lora_decode

if TYPE_CHECKING:
    from align.inference.fused_layers import FusedDecoder


class DenseMlp:
    """Mistral's SwiGLU MLP: gate/up fused into one product, silu(gate) * up the down product's prologue."""

    lora_mlp = True  # its gate/up/down are nn.Linear: LoRA adapters on them run in the decode step (lora_decode)

    @staticmethod
    def product_shapes(dec: "FusedDecoder") -> list[tuple[str, int, int]]:
        """(name, out, in) of the products it runs through the decoder's kernels (the row-count probe's)."""
        return [("gate_up", 2 * dec.ffn, dec.hidden), ("down", dec.hidden, dec.ffn)]

    @staticmethod
    def sources(layer) -> tuple[torch.Tensor, ...]:
        m = layer.mlp
        return m.gate_proj.weight, m.up_proj.weight, m.down_proj.weight

    @staticmethod
    def build(dec: "FusedDecoder", src) -> dict:
        return {"wgu": dec._prepare(torch.cat(src[:2])), "wdown": dec._prepare(src[2])}

    @staticmethod
    def run(dec: "FusedDecoder", i: int, hidden: torch.Tensor) -> torch.Tensor:
        norm = dec.layers[i].post_attention_layernorm
        gu = dec.normed_linear(norm, hidden, dec.fused[i].wgu)  # (N, 2F)
        adapters = dec.adapters[i]
        if adapters:
            gu = lora_decode.add(dec, adapters["gu"], hidden, gu, norm=norm)
        if dec._native_fp32(gu, None):
            wd = dec.fused[i].wdown
            out = chunked(lambda c, r: native_linear.linear(c, wd, residual=r, swiglu=True), gu, hidden)
            return lora_decode.add(dec, adapters["down"], gu, out, swiglu=True) if adapters else out
        act = F.silu(gu[:, :dec.ffn]) * gu[:, dec.ffn:]
        out = dec.linear_add(act, dec.fused[i].wdown, hidden)
        return lora_decode.add(dec, adapters["down"], act, out) if adapters else out
