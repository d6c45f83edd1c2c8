"""Runs an align Mistral model over one scheduled step with the paged KV cache, then samples.

The step's tokens from all sequences are one flat (N, D) batch: embeddings, norms, projections, MLPs and RoPE
are per token, so they run on the real tokens with no per-sequence padding (only a few rows to a batch-invariant
count, see `pad_rows`). Only attention looks across tokens: with `cpu_kernels` "native" one C call per layer for
all the step's tokens (`NativePlan`: each token's row and position), else `paged_attention` per query-shape group.
Decoding sequences are laid out first so their group is a contiguous slice. The native kernels keep the KV cache in
their own layout (keys transposed within a block, `native_cache_shapes`). The layers run through `FusedDecoder`
(the model's weights with q/k/v and gate/up fused, see fused_layers.py) and the model's own `embed_tokens`, `rope`,
`o_proj`, `down_proj`, `norm` and `lm_head`, so the engine computes the same function as
`MistralForCausalLM.forward`.

Logits are only computed for the rows that sample; the sampler then works through them in blocks of rows small
enough to stay in cache for the several passes it makes over each."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from align.inference.fused_layers import FusedDecoder
from align.inference.row_invariance import REFERENCE_ROWS, padder
from align.inference.paged_attention import (AttnGroup, NativeAttention, NativePlan, build_group, build_native_plan,
                                             group_attention, native_cache_shapes, native_write_kv,
                                             resolve_cpu_kernels, write_kv)
from align.inference.sampler import RowParams, sample
from align.inference.scheduler import StepPlan
from align.inference.sequence import Sequence

SAMPLE_CHUNK_ROWS = 16  # a (16, 32k) fp32 block stays in cache across the sampler's passes


@dataclass(frozen=True)
class StepInputs:
    input_ids: torch.Tensor  # (N,) int64
    positions: torch.Tensor  # (N,) int64
    slots: torch.Tensor  # (N,) int64: cache slot of each token
    groups: tuple[AttnGroup, ...]  # the "torch" kernel's query-shape groups (empty for "native")
    native: NativePlan | None  # the "native" kernel's per-token plan (None for "torch")
    sample_index: torch.Tensor  # (S',) int64: flat index of the last token of each sampling sequence (padded)
    sample_seqs: list[Sequence]


class ModelRunner:
    def __init__(self, model: torch.nn.Module, num_blocks: int, block_size: int, batch_invariant: bool = True,
                 linear_kernel: str = "auto", cpu_kernels: str = "auto", vocab_limit: int | None = None):
        cfg = model.config
        self.model = model
        self.vocab_limit = vocab_limit or cfg.vocab_size  # logits at and above it are -inf (Engine's docstring)
        self.block_size = block_size
        self.batch_invariant = batch_invariant
        self.trash_slot = num_blocks * block_size  # an extra block no sequence owns: padding rows write there
        self.sliding_window = cfg.sliding_window
        self.num_heads = cfg.num_attention_heads
        weight = model.model.embed_tokens.weight
        self.device = weight.device
        self.decoder = FusedDecoder(model, linear_kernel)
        self.cpu_kernels = resolve_cpu_kernels(cpu_kernels, self.device, weight.dtype, cfg.num_attention_heads,
                                               cfg.num_key_value_heads, cfg.head_dim, block_size)
        self.native_attention = NativeAttention() if self.cpu_kernels == "native" else None
        shape = (cfg.num_hidden_layers, num_blocks + 1, block_size, cfg.num_key_value_heads, cfg.head_dim)
        k_shape, v_shape = shape, shape
        if self.native_attention is not None:
            k_shape, v_shape = native_cache_shapes(cfg.num_hidden_layers, num_blocks + 1, block_size,
                                                   cfg.num_key_value_heads, cfg.head_dim)
        self.write_kv = native_write_kv if self.native_attention is not None else write_kv
        # NOTE: zeros, not empty: a masked-out key still enters SDPA, and a NaN from uninitialised memory there
        # turns 0 * NaN into NaN in the output.
        self.k_cache = torch.zeros(k_shape, dtype=weight.dtype, device=self.device)
        self.v_cache = torch.zeros(v_shape, dtype=weight.dtype, device=self.device)
        self._pads: dict[tuple, Callable[[int], int]] = {}  # (torch threads, adapter shapes) -> row padder
        # The sampler's probabilities buffer, reused every step: a fresh 2 MB (16 x 32k fp32) tensor per sampling
        # block is returned to and faulted in from the OS by glibc's allocator.
        self.sample_workspace = torch.empty(SAMPLE_CHUNK_ROWS * cfg.vocab_size, dtype=torch.float32,
                                            device=self.device)
        self.logits_workspace = torch.empty(0, dtype=torch.float32, device=self.device)  # grown on demand

    def pad_rows(self, m: int) -> int:
        """The row count a step's m rows are padded to so every row rounds as in any larger batch (m itself without
        batch_invariant, or on a row-invariant kernel). Measured per thread count (row_invariance.py): the kernels
        torch picks depend on it."""
        if not self.batch_invariant or self.decoder.row_invariant:
            return m
        key = (torch.get_num_threads(), self.decoder.adapter_shapes)  # a LoRA model's adapters are probed too
        if key not in self._pads:
            self._pads[key] = padder(self.decoder.agreeing_row_counts())
        return self._pads[key](m)

    @staticmethod
    def bytes_per_block(cfg, block_size: int, dtype: torch.dtype) -> int:
        elem = torch.empty((), dtype=dtype).element_size()
        return 2 * cfg.num_hidden_layers * block_size * cfg.num_key_value_heads * cfg.head_dim * elem

    def prepare(self, plan: StepPlan) -> StepInputs:
        bs = self.block_size
        order = sorted(range(len(plan)), key=lambda i: plan.num_tokens[i] != 1)  # decoders first (stable)
        ids, pos, slots, sample_index, sample_seqs = [], [], [], [], []
        rows: list[list[tuple]] = [[], []]  # (start, n, table) per group: decode, multi-token
        for i in order:
            seq, n = plan.seqs[i], plan.num_tokens[i]
            start, table = seq.num_computed_tokens, seq.block_table
            ids.extend(seq.tokens[start:start + n])
            for p in range(start, start + n):
                pos.append(p)
                slots.append(table[p // bs] * bs + p % bs)
            if start + n == seq.num_tokens:
                sample_index.append(len(ids) - 1)
                sample_seqs.append(seq)
            rows[n != 1].append((start, n, table))
        # Pad tokens and sampling rows to batch-invariant row counts (pad_rows): padding tokens are token 0 at
        # position 0 writing to the trash slot; padding sampling rows repeat the last one.
        pad = self.pad_rows(len(ids)) - len(ids)
        native = None
        if self.native_attention is not None:
            native = build_native_plan(rows[0] + rows[1], len(ids) + pad, bs, self.sliding_window,
                                       self.k_cache.shape[1])
        groups, offset = [], 0
        for members in rows if native is None else ():
            if members:
                n_tok = sum(m[1] for m in members)
                starts, lengths, tables = zip(*members)
                groups.append(build_group(list(starts), list(lengths), list(tables), bs,
                                          slice(offset, offset + n_tok), self.sliding_window, self.k_cache.dtype,
                                          self.device))
                offset += n_tok
        ids, pos, slots = ids + [0] * pad, pos + [0] * pad, slots + [self.trash_slot] * pad
        if sample_index:
            sample_index += sample_index[-1:] * (self.pad_rows(len(sample_index)) - len(sample_index))
        as_long = lambda x: torch.tensor(x, dtype=torch.int64, device=self.device)  # noqa: E731
        return StepInputs(as_long(ids), as_long(pos), as_long(slots), tuple(groups), native, as_long(sample_index),
                          sample_seqs)

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        if copies:
            src = torch.tensor([c[0] for c in copies], device=self.device)
            dst = torch.tensor([c[1] for c in copies], device=self.device)
            self.k_cache[:, dst] = self.k_cache[:, src]
            self.v_cache[:, dst] = self.v_cache[:, src]

    @torch.inference_mode()
    def forward(self, inputs: StepInputs) -> torch.Tensor:
        """Run all layers over the step's tokens; return final-normed hidden states of the sampling rows (S, D)."""
        m, dec = self.model.model, self.decoder
        hidden = m.embed_tokens(inputs.input_ids)  # (N, D)
        rope = m.layers[0].self_attn.rope(inputs.positions, hidden.dtype) if len(m.layers) else None
        fused_rope = self.native_attention is not None and hidden.dtype == torch.float32
        for i in range(len(m.layers)):
            if fused_rope:  # RoPE and the KV write in one C pass over the projection
                q = self.native_attention.rope_write_kv(dec.qkv_proj(i, hidden), *rope, self.k_cache[i],
                                                        self.v_cache[i], inputs.slots, self.num_heads)
            else:
                q, k, v = dec.qkv(i, hidden, rope)  # (N, H, Dh), (N, KVH, Dh) x2
                self.write_kv(self.k_cache[i], self.v_cache[i], inputs.slots, k, v)
            if inputs.native is not None:
                out = self.native_attention(q, self.k_cache[i], self.v_cache[i], inputs.native, self.sliding_window)
            elif len(inputs.groups) == 1 and inputs.groups[0].token_slice.stop == q.shape[0]:
                out = group_attention(q, self.k_cache[i], self.v_cache[i], inputs.groups[0])
            else:
                out = torch.zeros_like(q)  # padding rows stay zero
                for g in inputs.groups:
                    out[g.token_slice] = group_attention(q[g.token_slice], self.k_cache[i], self.v_cache[i], g)
            hidden = dec.mlp(i, dec.attn_out(i, hidden, out))
        return dec.norm(m.norm, hidden[inputs.sample_index])

    @torch.inference_mode()
    def sample(self, hidden: torch.Tensor, seqs: list[Sequence]) -> tuple[list[int], list[float], list[float]]:
        """Logits for the sampling rows, then a token per row, sampled SAMPLE_CHUNK_ROWS rows at a time."""
        params = _row_params(seqs, self.device)
        tokens, logprobs, model_logprobs = [], [], []
        lo = 0
        # NOTE: one matmul per REFERENCE_ROWS rows (the most a product runs on, row_invariance.py; the padded row
        # count makes the last chunk a measured one), not per sampling block: the head's weight (V x D, 32 MB for
        # the tiny profile) is larger than the caches, and each matmul streams all of it from memory.
        for chunk in hidden.split(REFERENCE_ROWS):
            logits = self.decoder.head(chunk, self._logits_buffer(chunk.shape[0]))  # (rows, V) fp32
            if self.vocab_limit < logits.shape[1]:
                logits[:, self.vocab_limit:] = float("-inf")  # padded head rows: no piece to decode
            for sub in range(0, min(logits.shape[0], len(seqs) - lo), SAMPLE_CHUNK_ROWS):
                rows = slice(lo + sub, min(lo + sub + SAMPLE_CHUNK_ROWS, len(seqs)))
                tok, lp, mlp = sample(logits[sub:sub + rows.stop - rows.start], params.rows(rows),
                                      self.sample_workspace, self.native_attention is not None)
                tokens += tok.tolist()
                logprobs += lp.tolist()
                model_logprobs += mlp.tolist()
            lo += logits.shape[0]
        return tokens, logprobs, model_logprobs


    def _logits_buffer(self, rows: int) -> torch.Tensor:
        """An fp32 (rows, V) view of a reused buffer (see FusedDecoder.head), grown to the largest step seen."""
        V = self.model.config.vocab_size
        if self.logits_workspace.numel() < rows * V:
            self.logits_workspace = torch.empty(rows * V, dtype=torch.float32, device=self.device)
        return self.logits_workspace[:rows * V].view(rows, V)


def _row_params(seqs: list[Sequence], device) -> RowParams:
    ps = [s.params for s in seqs]
    return RowParams(
        temperature=torch.tensor([p.temperature for p in ps], dtype=torch.float32, device=device),
        top_k=torch.tensor([p.top_k for p in ps], dtype=torch.int64, device=device),
        top_p=torch.tensor([p.top_p for p in ps], dtype=torch.float32, device=device),
        uniforms=torch.tensor([s.next_uniform() for s in seqs], dtype=torch.float64, device=device),
    )
