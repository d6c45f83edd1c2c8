"""Pretraining rows as bins of whole document pieces (`loader.packing = "greedy" | "ffd"`): the sequence packing of
SFT (align.data.packing) applied to the pretraining stream.

The epoch's mixture documents (align.data.token_order) are cut into pieces of at most seq_len tokens (a document
longer than a row continues in the next piece), and `packing.pack` places the pieces into rows of seq_len: greedy
keeps the stream order, ffd fills rows best and puts them in a seeded order. A row is its pieces back to back,
right-padded: `document_ids` per piece (-1 on padding, attention_mask False there), positions restarting per
piece, and no target on a piece's first token (the token before it in the row belongs to another piece).

Against the default `windows` layout (no padding, a document split wherever a window ends), bins never split a
document that fits in a row, at the price of the padding `epoch_padding` reports."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from align.data.collate import IGNORE_INDEX
from align.data.packing import pack
from align.data.pretrain_corpus import Split


@dataclass(frozen=True)
class BinStream:
    doc: np.ndarray  # (pieces,) training-split document of each piece, in row order
    offset: np.ndarray  # (pieces,) first token of the piece within its document
    length: np.ndarray  # (pieces,)
    bin_starts: np.ndarray  # (rows + 1,): row k holds pieces [bin_starts[k], bin_starts[k + 1])

    @property
    def instances(self) -> int:
        return len(self.bin_starts) - 1


def bin_stream(split: Split, docs: np.ndarray, seq_len: int, strategy: str, seed: int, epoch: int) -> BinStream:
    lengths = split.lengths[docs]
    counts = -(-lengths // seq_len)  # pieces per document
    doc = np.repeat(docs, counts)
    first = np.repeat(np.cumsum(counts) - counts, counts)
    offset = (np.arange(len(doc)) - first) * seq_len
    length = np.minimum(seq_len, np.repeat(lengths, counts) - offset)
    positions, bin_starts = pack(length, seq_len, strategy, seed, epoch)
    return BinStream(doc[positions], offset[positions], length[positions], bin_starts)


def bin_row(split: Split, stream: BinStream, k: int, seq_len: int, pad_id: int) -> dict[str, np.ndarray]:
    """Row k: tokens, document ids, positions, labels and attention mask (each (seq_len,))."""
    ids = np.full(seq_len, pad_id, dtype=np.int64)
    labels = np.full(seq_len, IGNORE_INDEX, dtype=np.int64)
    doc_ids = np.full(seq_len, -1, dtype=np.int64)
    positions = np.zeros(seq_len, dtype=np.int64)
    t = 0
    for d, p in enumerate(range(int(stream.bin_starts[k]), int(stream.bin_starts[k + 1]))):
        n, start = int(stream.length[p]), int(split.starts[stream.doc[p]] + stream.offset[p])
        ids[t:t + n] = split.tokens[start:start + n]
        labels[t + 1:t + n] = ids[t + 1:t + n]
        doc_ids[t:t + n], positions[t:t + n] = d, np.arange(n)
        t += n
    positions[t:] = np.arange(seq_len - t)  # the padding tail: its own RoPE run, as in packed SFT
    return {"input_ids": ids, "document_ids": doc_ids, "position_ids": positions, "labels": labels,
            "attention_mask": doc_ids >= 0}


def epoch_padding(stream: BinStream, seq_len: int) -> float:
    return 1.0 - float(stream.length.sum()) / (stream.instances * seq_len)
