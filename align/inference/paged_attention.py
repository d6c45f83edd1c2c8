"""Attention over a paged KV cache for a flat batch of tokens from many sequences.

Cache layout per layer: (num_blocks, block_size, KVH, Dh); token t of a sequence lives in block
`block_table[t // block_size]` at offset `t % block_size` (its "slot" = block * block_size + offset). A step writes
the new tokens' K/V to their slots first, then every sequence attends to its own blocks, gathered into a padded
(R, KVH, L, Dh) tensor with a mask; so a sequence sharing prefix blocks with others reads them like its own, and a
block written earlier in the same layer (a prompt computed in this very step) is already visible.

The rows of a step are split in two groups with different query shapes: decoding sequences (one query each, the
common case, with the query heads of a KV group folded into the query axis so SDPA runs without repeating K/V) and
sequences processing several tokens (prefill chunks, recomputation), padded to the longest chunk."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

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
