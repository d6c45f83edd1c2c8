"""The decoder layer and head the engine runs per step, with fused (and optionally pre-packed) projection weights.

A decode step is a handful of small matmuls per layer; on CPU each one pays a fixed dispatch and thread fork/join
cost that, at 16 rows, is comparable to the arithmetic. So q/k/v become one matmul against their concatenated
weights, gate/up another, RoPE rotates q and k in one call, and fp32 RMSNorm is torch's single-kernel `rms_norm`
(bit-identical to the model's fp32 expression; in other dtypes the model's own norm runs, for its rounding order).
The math is the model's: the same weights, `apply_rope`, SiLU-gated MLP, residuals.

Matmul kernels (`EngineConfig.linear_kernel`; "auto", the default, is "native" for fp32 on a CPU, else "onednn" where
it can run, else "torch"):
- "torch": `F.linear` on the weights, what the model's own forward runs (MKL sgemm in fp32 on CPU, cuBLAS on CUDA).
- "onednn": every projection and the head against weights pre-packed once by oneDNN for this CPU
  (`torch.ops.mkldnn._reorder_linear_weight` + `_linear_pointwise`, the pair inductor's CPU freezing uses).
  Measured on an AMD EPYC (Zen 4, AVX-512, 1 thread, fp32; bench/linear_kernels.py), where MKL dispatches no
  AVX-512 code: 16 rows x 256 -> 32k head 4.7 ms vs 12.3 ms for MKL, 128 rows x 512 -> 32k 45.5 ms vs 87.7 ms (47
  GMAC/s, one core's FMA peak), the small shape's 16-row MLP matmuls 1.5-1.8x faster, the tiny ones on par.
  It rounds differently from MKL (same fp32 arithmetic, another summation
  blocking: ~1e-6 of the largest logit on the AMD host; bitwise equal at hidden 256 on an Intel Sapphire Rapids
  host), so greedy text can differ from a decode on "torch" where two logits nearly tie; golden anchors pin the
  tokens of the kernel they were accepted with. It costs one extra copy of the weights, repacked after a weight
  update (43 ms for the tiny profile in fp32).
- "native": align/kernels/csrc/linear.c (fp32, CPU) on weights packed once into 16-column panels, each read front
  to back with a software prefetch and multiplied into tiles of rows held in registers: cold weights (the head
  streams the caches clean every step) are read near the core's bandwidth, where oneDNN's small-M kernels reach a
  fraction of it (bench/linear_kernels.py); on par with oneDNN at 128 rows. "auto" picks it for fp32 on a CPU.
  Its prologues take the elementwise steps before a product into the copy of x it makes anyway: the RMSNorms
  before q/k/v and gate/up (`normed_linear`), silu(gate) * up before down; no pass over memory, no temporary.
Which row counts round a row as any larger batch does is measured per kernel on the host (row_invariance.py,
`agreeing_row_counts`); the runner pads each step's rows to such a count. The native kernel needs no padding: each
of its outputs is one FMA chain over k whatever the rows beside it (`row_invariant`).

The fused and packed tensors are copies, so they must follow the model's weights. Every in-place write to a tensor
bumps its version counter; `refresh()` compares the counters (and storage pointers) of the source parameters with
those seen when the copies were made and rebuilds what changed. So an engine sharing its model with a trainer
cannot serve stale weights, whether or not `load_weights` was called."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from align.inference.dense_decode import DenseMlp
from align.inference.product_kernels import onednn_linear, onednn_pack, resolve_linear_kernel
from align.inference.row_invariance import REFERENCE_ROWS, agreeing_counts, chunked, padder
from align.inference.sparse_decode import SparseMlp
from align.kernels import linear as native_linear
from align.lora import decode as lora_decode
from align.model.family import family_of_model
from align.model.layers import apply_rope

@dataclass
class _Fused:
    wqkv: torch.Tensor  # (H*Dh + 2*KVH*Dh, D), packed for "onednn"
    wo: torch.Tensor  # (D, H*Dh): the module's own weight for "torch"
    wgu: object  # dense: (2*F, D); sparse: a tuple of E prepared (2*I, D) expert weights
    wdown: object  # dense: (D, F); sparse: E prepared (D, I)
    stamp: tuple  # (version, data_ptr) of every source weight when built
    wrouter: object = None  # sparse: the router (E, D), prepared for the product it runs on (`SparseMlp.router`)
    bqkv: torch.Tensor | None = None  # (H*Dh + 2*KVH*Dh,) the q/k/v biases concatenated (Qwen 2), else None


def _sources(layer) -> tuple[torch.Tensor, ...]:
    a = layer.self_attn
    return (a.q_proj.weight, a.k_proj.weight, a.v_proj.weight, a.o_proj.weight)


def _biases(layer) -> tuple[torch.Tensor, ...]:
    """The q, k, v biases of a layer that has them (Qwen 2), else (): part of the fused copies' stamp."""
    a = layer.self_attn
    return tuple(p.bias for p in (a.q_proj, a.k_proj, a.v_proj) if p.bias is not None)


# Per MLP kind (align.model.family's `Family.mlp`): what the decode step runs after attention. What runs before RoPE
# (biases, a QK-norm) is read from the attention module itself (`qk_norm`, the projections' biases), not the family.
DECODE_BLOCKS = {"dense": DenseMlp, "sparse": SparseMlp}


def decode_block(model: torch.nn.Module):
    """The decode block of the model's family, by the family's MLP kind (every one of `MLP_KINDS` has one)."""
    return DECODE_BLOCKS[family_of_model(model).mlp]


def _stamp(tensors) -> tuple:
    return tuple((t._version, t.data_ptr()) for t in tensors)


class FusedDecoder:
    def __init__(self, model: torch.nn.Module, kernel: str = "auto"):
        self.kernel = resolve_linear_kernel(kernel, model.lm_head.weight)  # "torch" or "onednn"
        self.block = decode_block(model)
        self.layers = model.model.layers
        self.lm_head = model.lm_head
        cfg = model.config
        self.q_dim = cfg.num_attention_heads * cfg.head_dim
        self.kv_dim = cfg.num_key_value_heads * cfg.head_dim
        self.ffn = cfg.intermediate_size
        self.hidden = cfg.hidden_size
        self._expert_pads: dict[tuple, object] = {}  # (threads, adapter shapes) -> row padder of the expert products
        self.heads = cfg.num_attention_heads + cfg.num_key_value_heads  # rotated heads: q and k together
        self.head_dim = cfg.head_dim
        # None | "head" (Qwen 3) | "projection" (OLMoE): align.model.mistral.MistralAttention.qk_norm
        self.qk_norm = self.layers[0].self_attn.qk_norm if len(self.layers) else None
        self.fused: list[_Fused | None] = [None] * len(self.layers)
        # per layer: {product: AdapterPair | None} when the layer has LoRA adapters (lora_decode), else {}
        self.adapters: list[dict] = [{} for _ in self.layers]
        self.adapter_stamps: list[tuple] = [() for _ in self.layers]
        self.adapter_shapes: tuple = ()  # lora_decode.product_shapes of them: part of the row-count probe's key
        self.whead: torch.Tensor | None = None
        self.head_stamp: tuple | None = None
        self.refresh()

    @property
    def row_invariant(self) -> bool:
        """Whether every row count rounds a row the same (by construction: the native kernel; a test probes it)."""
        return self.kernel == "native"

    def _prepare(self, w: torch.Tensor):
        if self.kernel == "onednn":
            return onednn_pack(w)
        if self.kernel == "native":
            return native_linear.pack(w)
        return w

    def linear(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """x (N, in) @ w.T -> (N, out) with the configured kernel; w as made by `_prepare`. At most
        REFERENCE_ROWS rows per call (row_invariance.chunked): only measured row counts reach the kernel."""
        if self.kernel == "onednn":
            return chunked(lambda c: onednn_linear(c, w), x)
        if self.kernel == "native":
            return chunked(lambda c: native_linear.linear(c, w), x)
        return chunked(lambda c: F.linear(c, w), x)

    def linear_add(self, x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """residual + x @ w.T. With oneDNN the add is the matmul's post-op (one pass fewer; in bf16 it rounds once
        instead of twice, so it is closer to the exact sum than the model's forward, not bitwise equal to it)."""
        if self.kernel == "onednn":
            return chunked(lambda c, r: torch.ops.mkldnn._linear_pointwise.binary(c, r, w, None, "add"), x, residual)
        if self.kernel == "native":
            return chunked(lambda c, r: native_linear.linear(c, w, residual=r), x, residual)
        return residual + self.linear(x, w)

    @torch.no_grad()
    def refresh(self) -> int:
        """Rebuild the fused copies of layers (and the head) whose weights changed since they were made; returns
        how many were rebuilt."""
        rebuilt = 0
        for i, layer in enumerate(self.layers):
            attn, mlp, bias = _sources(layer), self.block.sources(layer), _biases(layer)
            if self.fused[i] is None or self.fused[i].stamp != _stamp(attn + mlp + bias):
                self.fused[i] = _Fused(self._prepare(torch.cat(attn[:3])), self._prepare(attn[3]),
                                       stamp=_stamp(attn + mlp + bias), **self.block.build(self, mlp),
                                       bqkv=torch.cat(bias).detach().clone() if bias else None)
                rebuilt += 1
            adapters = lora_decode.adapter_tensors(layer, self.block.lora_mlp)
            if _stamp(adapters) != self.adapter_stamps[i]:  # a LoRA sync: only these copies, never the base's
                self.adapters[i] = {name: lora_decode.build_pair(self._prepare, mods) for name, mods in
                                    lora_decode.groups(layer, self.block.lora_mlp).items()} if adapters else {}
                self.adapter_stamps[i] = _stamp(adapters)
                rebuilt += 1
        self.adapter_shapes = tuple(lora_decode.product_shapes(p for layer in self.adapters for p in layer.values()))
        head = (self.lm_head.weight,)
        if self.head_stamp != _stamp(head):
            self.whead, self.head_stamp = self._prepare(head[0]), _stamp(head)
            rebuilt += 1
        return rebuilt

    @staticmethod
    def norm(module, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return F.rms_norm(x, module.weight.shape, module.weight, module.eps)
        return module(x)

    def _native_fp32(self, x: torch.Tensor, norm) -> bool:
        """Whether the product can take its elementwise step as a native prologue (fp32 rows and norm weight)."""
        return self.kernel == "native" and x.dtype == torch.float32 and (
            norm is None or norm.weight.dtype == torch.float32)

    def normed_linear(self, norm, x: torch.Tensor, w) -> torch.Tensor:
        """norm(x) @ w.T; on the native kernel the RMSNorm is the matmul's prologue (no pass of its own)."""
        if self._native_fp32(x, norm):
            arg = (norm.weight.detach().contiguous(), norm.eps)
            return chunked(lambda c: native_linear.linear(c, w, rms_norm=arg), x)
        return self.linear(self.norm(norm, x), w)

    def qkv_proj(self, i: int, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (N, D) -> the fused q, k, v projection (N, (H + 2 KVH) * Dh) of the normed hidden, no RoPE; with
        the biases added (Qwen 2) and the QK-norm applied (OLMoE: over the full q and k; Qwen 3: per head). NOTE:
        the runner's native path feeds this straight to the C RoPE + KV write (model_runner.forward), so everything
        before RoPE must happen here, not in `qkv`."""
        norm = self.layers[i].input_layernorm
        out = self.normed_linear(norm, hidden, self.fused[i].wqkv)
        if self.fused[i].bqkv is not None:  # as nn.Linear: the bias joins the product, before any adapter
            out += self.fused[i].bqkv
        if self.adapters[i]:  # before the QK-norm: the adapter is part of the projection
            out = lora_decode.add(self, self.adapters[i]["qkv"], hidden, out, norm=norm)
        if self.qk_norm is not None:
            a, n = self.layers[i].self_attn, hidden.shape[0]
            q, k, v = out.split((self.q_dim, self.kv_dim, self.kv_dim), dim=1)
            if self.qk_norm == "head":  # Qwen 3: each head's q and k over its head_dim
                q = self.norm(a.q_norm, q.view(n, -1, self.head_dim)).view(n, -1)
                k = self.norm(a.k_norm, k.view(n, -1, self.head_dim)).view(n, -1)
            else:  # OLMoE: RMSNorm over the full q and k projections
                q, k = self.norm(a.q_norm, q), self.norm(a.k_norm, k)
            out = torch.cat([q, k, v], dim=1)
        return out

    def qkv(self, i: int, hidden: torch.Tensor, rope) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """hidden (N, D) -> q (N, H, Dh), k (N, KVH, Dh), v (N, KVH, Dh); RoPE applied to q and k."""
        out = self.qkv_proj(i, hidden)  # (N, q + 2 kv)
        n = hidden.shape[0]
        qk = apply_rope(out[:, :self.q_dim + self.kv_dim].view(n, self.heads, self.head_dim), *rope)
        q, k = qk.split((self.q_dim // self.head_dim, self.kv_dim // self.head_dim), dim=1)
        return q, k, out[:, self.q_dim + self.kv_dim:].view(n, -1, self.head_dim)

    def attn_out(self, i: int, hidden: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """hidden (N, D) + o_proj(attn (N, H, Dh)) -> (N, D)."""
        x = attn.flatten(1)  # (N, H * Dh)
        out = self.linear_add(x, self.fused[i].wo, hidden)  # (N, D)
        return lora_decode.add(self, self.adapters[i]["o"], x, out) if self.adapters[i] else out

    def mlp(self, i: int, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (N, D) -> hidden + mlp(norm(hidden)). On the native kernel the norm is the gate/up product's
        prologue and silu(gate) * up the down product's."""
        return self.block.run(self, i, hidden)

    def pad_expert_rows(self, m: int) -> int:
        """The rows an expert product of m rows runs on (off the native kernel): the next count measured to round
        each row as a 128-row batch does. Padded whatever EngineConfig.batch_invariant says: an expert's row count
        changes with the batch's routing even when the step's does not (the runner's padding cannot cover it)."""
        key = (torch.get_num_threads(), self.adapter_shapes)
        if key not in self._expert_pads:
            self._expert_pads[key] = padder(self.agreeing_row_counts())
        return self._expert_pads[key](m)

    def agreeing_row_counts(self) -> tuple[int, ...]:
        """Row counts at which every projection and the head round each row as a large batch does (measured on
        this host for these weight shapes, this kernel, dtype and thread count; see row_invariance.py)."""
        w = self.lm_head.weight
        V, D = w.shape
        products = [("head", lambda x, wt: self._head_product(x, wt, torch.empty(x.shape[0], V, device=x.device)),
                     (V, D))]
        if len(self.layers):
            shapes = [("qkv", self.q_dim + 2 * self.kv_dim, D), ("o", D, self.q_dim)] + self.block.product_shapes(self)
            shapes += list(self.adapter_shapes)
            products += [(name, self.linear, (rows, cols)) for name, rows, cols in shapes]
        return agreeing_counts(products, self._prepare, w.dtype, w.device, self.kernel)

    def _head_product(self, hidden: torch.Tensor, whead: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
        if self.kernel == "torch" and hidden.dtype == torch.float32 and out is not None:
            return torch.mm(hidden, whead.t(), out=out)
        if self.kernel == "native" and out is not None and hidden.shape[0] <= REFERENCE_ROWS:
            return native_linear.linear(hidden, whead, out=out)
        logits = self.linear(hidden, whead)
        if logits.dtype == torch.float32 or out is None:
            return logits.float()
        return out.copy_(logits)

    def head(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Final-normed hidden (N, D) -> fp32 logits (N, V), written into `out` (N, V) fp32 when given.

        NOTE: a reused fp32 buffer, not a fresh (N, V) tensor per step: glibc hands such multi-MB blocks back to the
        OS and faults them in again, measured 0.7 ms for the bf16 -> fp32 copy of a 16 x 32k block (0.1 in place).
        For "torch" mm(out=) is bitwise F.linear (measured), "native" writes into it; oneDNN has no out= variant,
        so its fp32 logits are the op's own tensor."""
        return self._head_product(hidden, self.whead, out)
