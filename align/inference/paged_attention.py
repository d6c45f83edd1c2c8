"""Attention over a paged KV cache for a flat batch of tokens from many sequences.

Cache layout per layer: (num_blocks, block_size, KVH, Dh); token t of a sequence lives in block
`block_table[t // block_size]` at offset `t % block_size` (its "slot" = block * block_size + offset). A step writes
the new tokens' K/V to their slots first, then every sequence attends to its own blocks, gathered into a padded
(R, KVH, L, Dh) tensor with a mask; so a sequence sharing prefix blocks with others reads them like its own, and a
block written earlier in the same layer (a prompt computed in this very step) is already visible.

The rows of a step are split in two groups with different query shapes: decoding sequences (one query each, the
common case, with the query heads of a KV group folded into the query axis so SDPA runs without repeating K/V) and
sequences processing several tokens (prefill chunks, recomputation), padded to the longest chunk.

That is the "torch" path (`EngineConfig.cpu_kernels`), the one for CUDA. On a CPU the default is "native":
align/kernels/csrc/paged_attention.c reads each token's keys and values from their blocks in place (no gather, no
padding, no mask) in one call per layer for the whole step, every token on its own (`NativePlan`)."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from align.inference.config import CPU_KERNELS
from align.kernels import native

# NOTE: CPU SDPA rounds differently when a (batch, kv head) has fewer than 4 query rows (measured: 1-3 rows differ
# from 4+ by ~1e-7, 4..70 rows agree bitwise). Padding every call to at least 4 query rows makes a query's output
# independent of how many others share the call (decode vs prefill, alone vs batched); see EngineConfig.batch_invariant.
MIN_QUERY_ROWS = 4


@dataclass(frozen=True)
class AttnGroup:
    """Rows of one query shape. R rows, Tq queries per row (1 for decode), L = gathered key length."""

    block_tables: torch.Tensor  # (R, L // block_size) int64, padded with block 0 (masked out)
    mask: torch.Tensor  # (R, 1, Tq, L) additive: 0 = may attend, -inf = masked
    token_slice: slice  # where this group's tokens sit in the step's flat token axis
    pad_index: torch.Tensor | None  # (n_tokens,) positions in the flattened (R * Tq) padded layout; None: Tq == 1


def build_group(starts: list[int], lengths: list[int], tables: list[list[int]], block_size: int,
                token_slice: slice, sliding_window: int | None, dtype: torch.dtype, device=None) -> AttnGroup:
    """starts[r]: cached tokens of row r before this step; lengths[r]: tokens it processes now."""
    R = len(starts)
    ends = [s + n for s, n in zip(starts, lengths)]
    nb = -(-max(ends) // block_size)
    padded = [t[:nb] + [0] * (nb - len(t[:nb])) for t in tables]
    block_tables = torch.tensor(padded, dtype=torch.int64, device=device)  # (R, nb)
    tq = max(max(lengths), MIN_QUERY_ROWS) if max(lengths) > 1 else 1  # decode rows: see group_attention
    start = torch.tensor(starts, dtype=torch.int64, device=device)
    n = torch.tensor(lengths, dtype=torch.int64, device=device)
    steps = torch.arange(tq, device=device)
    q_pos = start[:, None] + steps[None, :]  # (R, Tq): position of each query
    key = torch.arange(nb * block_size, device=device)[None, None, :]  # (1, 1, L)
    mask = key <= q_pos[:, :, None]  # causal; also excludes keys past each row's end
    if sliding_window is not None:
        mask &= key > q_pos[:, :, None] - sliding_window  # as transformers: kv_idx > q_idx - window
    pad_index = None
    if tq > 1:  # decode rows (tq = 1) have no padded queries
        valid = steps[None, :] < n[:, None]  # (R, Tq)
        # NOTE: padded query rows attend to key 0 so no row is fully masked; their outputs are discarded.
        mask &= valid[:, :, None] | (key == 0)
        pad_index = (torch.arange(R, device=device)[:, None] * tq + steps[None, :])[valid]
    # NOTE: an additive float mask, built once per step: SDPA on CPU converts a bool mask to this form on every
    # call (every layer), measured ~1.6x the attention time at 128 decoding rows.
    additive = torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill_(~mask, float("-inf"))
    return AttnGroup(block_tables, additive[:, None], token_slice, pad_index)


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, k: torch.Tensor,
             v: torch.Tensor) -> None:
    """Store new keys/values (N, KVH, Dh) at their slots in one layer's cache (num_blocks, bs, KVH, Dh)."""
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, k.to(k_cache.dtype))
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, v.to(v_cache.dtype))


def _gather(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """(num_blocks, bs, KVH, Dh) gathered by (R, nb) -> (R, KVH, nb * bs, Dh) (a transposed view)."""
    R, nb = block_tables.shape
    # NOTE: index_select on whole blocks (rows of bs * KVH * Dh), not cache[block_tables]: the advanced-indexing
    # path measured 4-7x slower on CPU for the same copy.
    blocks = cache.view(cache.shape[0], -1).index_select(0, block_tables.view(-1))
    return blocks.view(R, nb * cache.shape[1], *cache.shape[2:]).transpose(1, 2)


def group_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, group: AttnGroup) -> torch.Tensor:
    """Attention for one group. q: (n_tokens, H, Dh) of the group's tokens -> (n_tokens, H, Dh)."""
    k = _gather(k_cache, group.block_tables)  # (R, KVH, L, Dh)
    v = _gather(v_cache, group.block_tables)
    R, kvh = k.shape[0], k.shape[1]
    h, dh = q.shape[1], q.shape[2]
    if group.pad_index is None:
        # Decode: the H // KVH query heads sharing a KV head become that head's query axis (no K/V repeat).
        g = h // kvh
        qg = q.view(R, kvh, g, dh)  # (R, KVH, G, Dh)
        if g < MIN_QUERY_ROWS:
            qg = F.pad(qg, (0, 0, 0, MIN_QUERY_ROWS - g))
        out = F.scaled_dot_product_attention(qg, k, v, attn_mask=group.mask)  # mask (R, 1, 1, L) broadcasts
        return out[:, :, :g].reshape(R, h, dh)
    tq = group.mask.shape[2]
    q_pad = q.new_zeros(R * tq, h, dh)
    q_pad[group.pad_index] = q
    q_pad = q_pad.view(R, tq, h, dh).transpose(1, 2)  # (R, H, Tq, Dh)
    out = F.scaled_dot_product_attention(q_pad, k, v, attn_mask=group.mask, enable_gqa=h != kvh)
    return out.transpose(1, 2).reshape(R * tq, h, dh)[group.pad_index]  # (n_tokens, H, Dh)


_NATIVE_DTYPES = (torch.float32, torch.bfloat16)
_I64, _PTR = native.I64, native.PTR
SIGNATURES: native.Signatures = {
    "align_paged_attention": ([_PTR, _PTR, _PTR, _I64, _PTR, _I64, _PTR, _PTR, _I64, _I64, _I64, _I64, _I64, _I64,
                               native.F32, _PTR, _PTR, _I64, _I64], ctypes.c_int),
    "align_paged_attention_scratch": ([_I64, _I64, _I64, _I64], _I64),
    "align_rope_write_kv": ([_PTR, _I64, _I64, _I64, _I64, _I64, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR, _I64, _I64,
                             _I64], ctypes.c_int),
}


@dataclass(frozen=True)
class NativePlan:
    """Where each of the step's N tokens reads its keys (the "native" kernel)."""

    block_tables: torch.Tensor  # (R, nb) int64, rows padded with block 0 (never read: keys stop at the position)
    tok_row: torch.Tensor  # (N,) int64: the token's row in block_tables, -1 for a padding token (zero output)
    tok_pos: torch.Tensor  # (N,) int64: its position; it attends to keys max(0, pos - window + 1) .. pos
    max_keys: int  # the most keys any token attends to (sizes the kernel's score scratch)


def build_native_plan(rows: list[tuple[int, int, list[int]]], n_tokens: int, block_size: int,
                      sliding_window: int | None, num_blocks: int) -> NativePlan:
    """rows[r] = (cached tokens before this step, tokens it processes now, block table), in the step's token order;
    tokens past the rows' total (up to n_tokens) are padding. The kernel reads blocks unchecked, so here every
    table must cover its row's tokens with blocks of a cache of `num_blocks`."""
    nb = max(-(-(start + n) // block_size) for start, n, _ in rows)
    for r, (start, n, table) in enumerate(rows):  # the C kernel reads every block up to each token's position
        if start + n > len(table) * block_size:
            raise ValueError(f"row {r}: tokens up to position {start + n - 1} but a block table of {len(table)} "
                             f"blocks of {block_size}")
        if table and not 0 <= min(table) <= max(table) < num_blocks:
            raise ValueError(f"row {r}: block table {table} leaves a cache of {num_blocks} blocks")
    tables = [table[:nb] + [0] * (nb - len(table[:nb])) for _, _, table in rows]
    tok_row, tok_pos = [], []
    for r, (start, n, _) in enumerate(rows):
        tok_row += [r] * n
        tok_pos += range(start, start + n)
    pad = n_tokens - len(tok_row)
    longest = max(start + n for start, n, _ in rows)
    as_long = lambda x: torch.tensor(x, dtype=torch.int64)  # noqa: E731
    return NativePlan(as_long(tables), as_long(tok_row + [-1] * pad), as_long(tok_pos + [0] * pad),
                      min(longest, sliding_window) if sliding_window else longest)


def _native_lib() -> ctypes.CDLL:
    return native.load("paged_attention", SIGNATURES)


def native_unsupported(device: torch.device, dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int,
                       block_size: int) -> str | None:
    """Why the "native" kernel cannot serve this cache (None: it can)."""
    if device.type != "cpu":
        return f"it runs on CPU tensors, the cache is on {device}"
    if dtype not in _NATIVE_DTYPES:
        return f"it reads float32 or bfloat16 caches, not {dtype}"
    if heads % kv_heads or heads > 256:
        return f"it needs at most 256 query heads, a multiple of the KV heads: got {heads} / {kv_heads}"
    if head_dim % 16 or block_size % 16:
        return f"it needs head_dim and block_size multiples of 16, got {head_dim} and {block_size}"
    try:
        _native_lib()
        native.load("sampling")  # the sampler's half of cpu_kernels "native" (typed by sampler.native_lib)
    except native.NativeUnavailable as err:
        return str(err)
    return None


def resolve_cpu_kernels(kernel: str, device: torch.device, dtype: torch.dtype, heads: int, kv_heads: int,
                        head_dim: int, block_size: int) -> str:
    """EngineConfig.cpu_kernels -> the kernel to run: "auto" is "native" where it can run, else "torch"."""
    if kernel not in CPU_KERNELS:
        raise ValueError(f"EngineConfig.cpu_kernels must be one of {CPU_KERNELS}, got {kernel!r}")
    if kernel == "torch":
        return kernel
    why = native_unsupported(device, dtype, heads, kv_heads, head_dim, block_size)
    if why is None:
        return "native"
    if kernel == "native":
        raise ValueError(f"cpu_kernels 'native' cannot run here: {why}")
    return "torch"


def native_cache_shapes(layers: int, blocks: int, block_size: int, kv_heads: int,
                        head_dim: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The "native" kernel's K and V cache shapes: keys transposed within a block (see csrc/paged_attention.c)."""
    return (layers, blocks, kv_heads, head_dim, block_size), (layers, blocks, kv_heads, block_size, head_dim)


def native_write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, k: torch.Tensor,
                    v: torch.Tensor) -> None:
    """write_kv for the native layout: one layer's K (blocks, KVH, Dh, bs) and V (blocks, KVH, bs, Dh)."""
    bs = k_cache.shape[-1]
    block, offset = slots // bs, slots % bs
    k_cache.permute(0, 3, 1, 2).index_put_((block, offset), k.to(k_cache.dtype))  # (blocks, bs, KVH, Dh) view
    v_cache.transpose(1, 2).index_put_((block, offset), v.to(v_cache.dtype))


class NativeAttention:
    """The "native" kernel for one runner: a scratch buffer reused across calls (grown on demand), and the step's
    RoPE + KV write in one C pass (`rope_write_kv`)."""

    def __init__(self):
        self.lib = _native_lib()
        self.scratch = torch.empty(0, dtype=torch.float32)

    def __call__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: NativePlan,
                 window: int | None) -> torch.Tensor:
        """q: (N, H, Dh) of all the step's tokens; caches: one layer's, native_cache_shapes -> (N, H, Dh)."""
        n, h, dh = q.shape
        kvh, bs = k_cache.shape[1], k_cache.shape[3]
        assert k_cache.is_contiguous() and v_cache.is_contiguous() and k_cache.dtype == v_cache.dtype
        assert k_cache.shape[2] == dh and v_cache.shape[1:] == (kvh, bs, dh) and bs % 16 == 0 and dh % 16 == 0
        assert plan.tok_row.shape == (n,) and k_cache.dtype in _NATIVE_DTYPES
        threads = max(1, torch.get_num_threads())
        per_worker = self.lib.align_paged_attention_scratch(h, kvh, dh, plan.max_keys)
        if self.scratch.numel() < threads * per_worker:
            self.scratch = torch.empty(threads * per_worker, dtype=torch.float32)
        q32 = q.to(torch.float32).contiguous()
        out = torch.empty((n, h, dh), dtype=torch.float32)
        self.lib.align_paged_attention(
            q32.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), int(k_cache.dtype == torch.bfloat16),
            plan.block_tables.data_ptr(), plan.block_tables.shape[1], plan.tok_row.data_ptr(),
            plan.tok_pos.data_ptr(), n, h, kvh, dh, bs, window or 0, dh ** -0.5, out.data_ptr(),
            self.scratch.data_ptr(), plan.max_keys, threads)
        return out if q.dtype == torch.float32 else out.to(q.dtype)

    def rope_write_kv(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                      v_cache: torch.Tensor, slots: torch.Tensor, heads: int) -> torch.Tensor:
        """The fp32 qkv projection (N, (H + 2 KVH) * Dh) -> rotated q (N, H, Dh); the rotated keys and the values
        are written at `slots` of one layer's caches (native_cache_shapes), with apply_rope's exact rounding and
        write_kv's cast. One pass over the step's tokens instead of RoPE's six torch ops and two index_put_."""
        n = qkv.shape[0]
        kvh, dh, bs = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
        assert qkv.dtype == torch.float32 and qkv.stride(1) == 1 and qkv.shape[1] == (heads + 2 * kvh) * dh
        assert cos.shape == sin.shape == (n, dh) and cos.dtype == sin.dtype == torch.float32
        assert cos.is_contiguous() and sin.is_contiguous() and dh <= 1024
        assert slots.shape == (n,) and slots.dtype == torch.int64 and slots.is_contiguous()
        assert k_cache.is_contiguous() and v_cache.is_contiguous() and k_cache.dtype in _NATIVE_DTYPES
        q = torch.empty((n, heads, dh), dtype=torch.float32)
        self.lib.align_rope_write_kv(qkv.data_ptr(), qkv.stride(0), n, heads, kvh, dh, cos.data_ptr(),
                                     sin.data_ptr(), slots.data_ptr(), q.data_ptr(), k_cache.data_ptr(),
                                     v_cache.data_ptr(), bs, int(k_cache.dtype == torch.bfloat16),
                                     max(1, torch.get_num_threads()))
        return q
