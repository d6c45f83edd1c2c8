"""The OLMoE block of the engine's decode step (`SparseMlp`, align.inference.fused_layers' "olmoe" entry): the
MoE computation of align.model.moe with every product on the decoder's kernel, so that a decode row's output never
depends on the other rows of the batch."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from align.inference.product_kernels import native_unsupported
from align.inference.row_invariance import chunked
from align.kernels import linear as native_linear
from align.model.moe import combine, gather_rows, route, router_compute_dtype, sort_by_expert, unsort_rows

if TYPE_CHECKING:
    from align.inference.fused_layers import FusedDecoder


class SparseMlp:
    """OLMoE: QK-norm on the fused q/k projection; the MoE block as align.model.moe computes it (route, stable sort
    by expert, per-expert SwiGLU, the fixed-order combine), with every product on the decoder's kernel so that a
    row's output never depends on the rows beside it. The model's own block would not do: its expert matmuls run
    on however many rows each expert got this step, and BLAS rounds a row by the shape it sits in.

    - The router and each expert's gate_up / down are products of their own on prepared (packed) weights. On the
      native kernel (row-invariant by construction) that is all; on "torch" / "onednn" each expert's rows are
      padded with zero rows to a row count measured to round as a 128-row batch (row_invariance.py), as the
      runner pads a step's rows for the dense products (it pads the router's, which sees the step's rows).
    - router_dtype "fp32" on a model that is not fp32: the router product runs on an fp32 copy, on the native
      kernel where it builds (CPU), else by F.linear (CUDA: outside the guarantee, as any unprobed product is).
    Values equal the model's forward up to the kernels' rounding, as for the dense path."""

    lora_mlp = False  # the experts are stacked 3-D weights, not nn.Linear (align.lora.adapters refuses them as targets)

    @staticmethod
    def product_shapes(dec: FusedDecoder) -> list[tuple[str, int, int]]:
        mlp = dec.layers[0].mlp
        inter = mlp.experts.down_proj.shape[2]
        return [("router", mlp.num_experts, dec.hidden), ("expert_gate_up", 2 * inter, dec.hidden),
                ("expert_down", dec.hidden, inter)]

    @staticmethod
    def sources(layer) -> tuple[torch.Tensor, ...]:
        m = layer.mlp
        if m.ep is not None:
            raise ValueError("the engine decodes with every expert in one process; this model is expert-parallel "
                             "(SparseMoeBlock.ep is set): gather its experts first")
        return m.gate.weight, m.experts.gate_up_proj, m.experts.down_proj

    @staticmethod
    def build(dec: FusedDecoder, src) -> dict:
        router, gate_up, down = src
        return {"wgu": tuple(dec._prepare(w) for w in gate_up), "wdown": tuple(dec._prepare(w) for w in down),
                "wrouter": {}}  # compute dtype -> (kind, prepared weight), filled by `router` on first use

    @staticmethod
    def router(dec: FusedDecoder, i: int, normed: torch.Tensor) -> torch.Tensor:
        """normed (N, D) -> router logits (N, E) in the router's compute dtype (Router.router_dtype, read per step:
        a switch after the engine was built applies too)."""
        gate = dec.layers[i].mlp.gate
        want = router_compute_dtype(normed.dtype, gate.router_dtype)
        cache = dec.fused[i].wrouter
        if want not in cache:
            cache[want] = _prepare_router(dec, gate.weight, want)
        kind, w = cache[want]
        if kind == "decoder":
            return dec.linear(normed, w)
        if kind == "native":
            return chunked(lambda c: native_linear.linear(c, w), normed.to(want))
        return F.linear(normed.to(want), w)

    @staticmethod
    def experts(dec: FusedDecoder, i: int, rows: torch.Tensor, e: int) -> torch.Tensor:
        """One expert's SwiGLU on its rows (m, D) -> (m, D), padded to an agreeing row count off the native kernel."""
        f, m = dec.fused[i], rows.shape[0]
        if dec._native_fp32(rows, None):
            gu = chunked(lambda c: native_linear.linear(c, f.wgu[e]), rows)
            return chunked(lambda c: native_linear.linear(c, f.wdown[e], swiglu=True), gu)
        pad = dec.pad_expert_rows(m) - m
        if pad:
            rows = torch.cat([rows, rows.new_zeros(pad, rows.shape[1])])
        gu = dec.linear(rows, f.wgu[e])
        inter = gu.shape[1] // 2
        return dec.linear(F.silu(gu[:, :inter]) * gu[:, inter:], f.wdown[e])[:m]

    @staticmethod
    def run(dec: FusedDecoder, i: int, hidden: torch.Tensor) -> torch.Tensor:
        mlp = dec.layers[i].mlp
        normed = dec.norm(dec.layers[i].post_attention_layernorm, hidden)
        routing = route(SparseMlp.router(dec, i, normed), mlp.top_k, mlp.norm_topk_prob, weight_dtype=hidden.dtype)
        dispatch = sort_by_expert(routing.topk_ids, mlp.num_experts)
        outs = [SparseMlp.experts(dec, i, rows, e)
                for e, rows in enumerate(gather_rows(normed, dispatch).split(dispatch.counts.tolist())) if len(rows)]
        return hidden + combine(unsort_rows(torch.cat(outs), dispatch), routing.topk_weights)


def _prepare_router(dec: FusedDecoder, weight: torch.Tensor, want: torch.dtype) -> tuple[str, object]:
    """The router weight for logits in `want`: the decoder's kernel in the model's dtype, else an fp32 copy on the
    native kernel where it runs (row-invariant), else a plain copy for F.linear."""
    if want == weight.dtype:
        return "decoder", dec._prepare(weight)
    w = weight.detach().to(want)
    if native_unsupported(w) is None:
        return "native", native_linear.pack(w)
    return "torch", w
