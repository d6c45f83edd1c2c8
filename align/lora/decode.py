"""LoRA adapters in the engine's decode step: base(x) + (x A^T)(s B)^T, never merged into the base.

A LoRA policy's sampler holds a LoRA-wrapped copy of the base (align.lora.stage.AdapterWeightsClient): its
projections are `align.lora.adapters.LoraLinear`, whose `.weight` is the frozen base, so `FusedDecoder` packs the base
panels once as for any model, and a weight sync writes only the adapter tensors. Each fused product (q/k/v, o,
gate/up, down) with adapters gets two thin products of its own on the decoder's kernel:

    xa = prologue(x) @ A_cat^T          A_cat (sum r, in): the product's adapters' A stacked
    y  = y_base + xa @ B_bd^T           B_bd (out, sum r): block diagonal, projection j's alpha/r * B_j in its block

so the q/k/v product keeps ONE adapter pair (not three). On the native kernel the prologue is the base product's
own (the RMSNorm before q/k/v and gate/up, silu(gate) * up before down) and y_base enters as the second product's
residual: no pass of their own, and each output stays one FMA chain per product (row-invariant). The zero blocks of
B_bd add exact zeros (fma(0, x, acc) = acc), so projection j's update is its own (x A_j^T)(s B_j)^T. Off the native
kernel the prologue runs in torch and the two products go through `FusedDecoder.linear`, with their shapes in the
row-count probe (`product_shapes`).

Equal to the merged model (W + s B A) up to fp32 rounding, not bitwise: the merged product rounds x (W + sBA)^T,
this one x W^T + (x A^T)(s B)^T (tests/inference/test_engine_lora.py). Refreshed from the adapters' own version
counters: a sync rebuilds these few-kB copies, never the base panels."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from align.inference.row_invariance import chunked
from align.kernels import linear as native_linear
from align.lora.adapters import LoraLinear


@dataclass
class AdapterPair:
    a: object  # A_cat (sum r, in), prepared for the decoder's kernel
    b: object  # B_bd (out, sum r), scaled by alpha / r, prepared
    rank: int  # sum r
    out: int
    inp: int


def groups(layer, dense_mlp: bool) -> dict[str, tuple]:
    """The projections of each fused product of a decoder layer, in the order the product concatenates them."""
    a = layer.self_attn
    out = {"qkv": (a.q_proj, a.k_proj, a.v_proj), "o": (a.o_proj,)}
    if dense_mlp:
        m = layer.mlp
        out.update(gu=(m.gate_proj, m.up_proj), down=(m.down_proj,))
    return out


def adapter_tensors(layer, dense_mlp: bool) -> tuple[torch.Tensor, ...]:
    """Every adapter tensor of the layer (what the adapters' refresh stamp covers)."""
    return tuple(t for mods in groups(layer, dense_mlp).values() for m in mods if isinstance(m, LoraLinear)
                 for t in (m.lora_A.weight, m.lora_B.weight))


@torch.no_grad()
def build_pair(prepare, modules) -> AdapterPair | None:
    """The product's adapter pair, or None when none of its projections has an adapter."""
    lora = [(j, m) for j, m in enumerate(modules) if isinstance(m, LoraLinear)]
    if not lora:
        return None
    a_cat = torch.cat([m.lora_A.weight.detach() for _, m in lora])
    offsets = [0]
    for m in modules:
        offsets.append(offsets[-1] + m.out_features)
    b_bd = a_cat.new_zeros(offsets[-1], a_cat.shape[0])
    col = 0
    for j, m in lora:
        r = m.lora_A.weight.shape[0]
        b_bd[offsets[j]:offsets[j + 1], col:col + r] = m.lora_B.weight.detach() * m.scaling
        col += r
    return AdapterPair(prepare(a_cat.contiguous()), prepare(b_bd), a_cat.shape[0], offsets[-1], a_cat.shape[1])


def add(dec, pair: AdapterPair | None, x: torch.Tensor, y: torch.Tensor, norm=None,
        swiglu: bool = False) -> torch.Tensor:
    """y + (prologue(x) A_cat^T) B_bd^T; prologue: `norm` (an RMSNorm module) or silu(gate) * up (`swiglu`, x holds
    gate and up side by side) or none. y is returned unchanged without a pair."""
    if pair is None:
        return y
    if dec._native_fp32(x, norm):
        arg = None if norm is None else (norm.weight.detach().contiguous(), norm.eps)
        xa = chunked(lambda c: native_linear.linear(c, pair.a, rms_norm=arg, swiglu=swiglu), x)
        return chunked(lambda c, r: native_linear.linear(c, pair.b, residual=r), xa, y)
    if norm is not None:
        x = dec.norm(norm, x)
    elif swiglu:
        half = x.shape[1] // 2
        x = F.silu(x[:, :half]) * x[:, half:]
    return dec.linear_add(dec.linear(x, pair.a), pair.b, y)


def product_shapes(pairs) -> list[tuple[str, int, int]]:
    """(name, out, in) of the adapter products (for the row-count probe): one (A, B) shape pair per distinct shape."""
    shapes = set()
    for p in pairs:
        if p is not None:
            shapes |= {("lora_a", p.rank, p.inp), ("lora_b", p.out, p.rank)}
    return sorted(shapes)
