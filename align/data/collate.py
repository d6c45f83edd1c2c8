"""Rows of a shard set to the batch dicts of docs/CONTRACTS.md ("Data"). Right padding; labels are input-aligned
(transformers' convention: position t holds token t, the loss shifts), -100 where the loss mask is 0 or padding.

- sft:     input_ids (B, T) int64, labels (B, T) int64, attention_mask (B, T) bool, row_index (B,) int64
- pairs:   chosen_input_ids / chosen_labels / chosen_attention_mask, the same for rejected, all (B, T) with one
           width T for both arms (so a DPO step may concatenate them into one forward), pair_index (B,) int64
- prompts: prompt_ids list[list[int]], gold list[str], group list[str], prompt_index (B,) int64
- packed sft (`collate_packed`): input_ids, labels, attention_mask (B, seq_len) as above, plus position_ids (B,
           seq_len) int64 restarting at 0 in every document, document_ids (B, seq_len) int64 (0, 1, ... per row, -1 on
           padding), row_index (N,) int64: the shard rows of the N documents, row by row in layout order"""

from __future__ import annotations

import numpy as np
import torch

from align.data.order import round_up
from align.data.store import ShardSet

IGNORE_INDEX = -100


def _pad(seqs: list[tuple[np.ndarray, np.ndarray]], width: int, pad_id: int) -> dict[str, torch.Tensor]:
    ids = np.full((len(seqs), width), pad_id, dtype=np.int64)  # shape: (B, T)
    labels = np.full((len(seqs), width), IGNORE_INDEX, dtype=np.int64)
    mask = np.zeros((len(seqs), width), dtype=bool)
    for b, (tokens, loss_mask) in enumerate(seqs):
        n = len(tokens)
        ids[b, :n] = tokens
        labels[b, :n] = np.where(loss_mask.astype(bool), tokens, IGNORE_INDEX)
        mask[b, :n] = True
    return {"input_ids": torch.from_numpy(ids), "labels": torch.from_numpy(labels),
            "attention_mask": torch.from_numpy(mask)}


def collate(shards: ShardSet, rows: np.ndarray, pad_id: int = 0, pad_to_multiple: int = 1) -> dict:
    """The batch of `rows` (shard-set row indices) in the layout of the set's record kind."""
    index = torch.from_numpy(np.asarray(rows, dtype=np.int64).copy())
    if shards.kind == "prompts":
        metas = [shards.meta(int(r)) for r in rows]
        return {"prompt_ids": [shards.sequence(int(r))[0].tolist() for r in rows],
                "gold": [m["gold"] for m in metas], "group": [m["group"] for m in metas], "prompt_index": index}
    arms = [[shards.sequence(int(r), arm) for r in rows] for arm in range(shards.seqs_per_row)]
    width = round_up(max(len(ids) for arm in arms for ids, _ in arm), pad_to_multiple)
    if shards.kind == "sft":
        return {**_pad(arms[0], width, pad_id), "row_index": index}
    chosen, rejected = _pad(arms[0], width, pad_id), _pad(arms[1], width, pad_id)
    return {**{f"chosen_{k}": v for k, v in chosen.items()}, **{f"rejected_{k}": v for k, v in rejected.items()},
            "pair_index": index}


def collate_packed(shards: ShardSet, batch_rows: list[np.ndarray], seq_len: int, pad_id: int = 0) -> dict:
    """Packed SFT micro-batch: batch row b holds the conversations `batch_rows[b]` back to back, right-padded.

    The first token of every document gets label -100: the token before it ends the previous document, and
    predicting across the boundary would train on a pairing that never occurs (the model sees documents alone).
    Unpacked, that label is never a target either (the shift drops position 0), so a document's loss is the same
    packed or alone."""
    b_rows = len(batch_rows)
    ids = np.full((b_rows, seq_len), pad_id, dtype=np.int64)  # shape: (B, T)
    labels = np.full((b_rows, seq_len), IGNORE_INDEX, dtype=np.int64)
    mask = np.zeros((b_rows, seq_len), dtype=bool)
    positions = np.zeros((b_rows, seq_len), dtype=np.int64)
    documents = np.full((b_rows, seq_len), -1, dtype=np.int64)
    for b, rows in enumerate(batch_rows):
        t = 0
        for d, row in enumerate(rows.tolist()):
            tokens, loss_mask = shards.sequence(row)
            n = len(tokens)
            if t + n > seq_len:
                raise ValueError(f"{shards.path}: documents {rows.tolist()} need more than {seq_len} tokens")
            ids[b, t:t + n] = tokens
            labels[b, t:t + n] = np.where(loss_mask.astype(bool), tokens, IGNORE_INDEX)
            labels[b, t] = IGNORE_INDEX
            mask[b, t:t + n], positions[b, t:t + n], documents[b, t:t + n] = True, np.arange(n), d
            t += n
        positions[b, t:] = np.arange(seq_len - t)  # the padding tail counts as one more segment (its own RoPE run)
    return {"input_ids": torch.from_numpy(ids), "labels": torch.from_numpy(labels),
            "attention_mask": torch.from_numpy(mask), "position_ids": torch.from_numpy(positions),
            "document_ids": torch.from_numpy(documents),
            "row_index": torch.from_numpy(np.concatenate([np.asarray(r, dtype=np.int64) for r in batch_rows]))}
