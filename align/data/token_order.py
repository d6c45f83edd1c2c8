"""The pretraining data order: token-addressed, world-size invariant, over packed documents of a weighted mixture.

Epoch e of the stream is built in three pure steps (every rank computes the same without talking to the others):

1. Mixture. Source s gets a target of w_s / sum(w) x E tokens (E = `epoch_tokens`, default the training split's
   token count). It contributes documents from its own seeded permutation of its documents (align.data.order), in
   that order, cycling when its documents run out, until the target is reached. A source repeated more than
   `max_repetition` times in one epoch is refused: that mixture asks for more than the data holds.
2. Order. All picked documents in one seeded permutation, then back to back: one token stream per epoch.
3. Windows. Instance k of the epoch is tokens [k L, (k + 1) L) of that stream (L = seq_len; the tail that does not
   fill a window is dropped). A document may run across two windows; each window carries `document_ids` and
   `position_ids` that restart at every document start inside it, so attention never crosses a document (the
   model's block-diagonal mask, the same batch layout as packed SFT, align.data.collate), and the label of every
   document's first token is -100 (it would be predicted from the previous document's EOS). With `packing =
   "greedy" | "ffd"` an instance is instead a padded row of whole document pieces placed by SFT's bin packing
   (align.data.token_bins); everything below holds for both.

The address of the data is a token count: optimizer step s covers the instances [s G, (s + 1) G) of the global
instance sequence (G = world_size x grad_accum x micro_batch_size instances), rank r takes micro-batches a x
world_size + r of them. The state is the number of tokens consumed, so a resume at another world size continues at
the same token of the same stream (the same batches, when the global batch is unchanged: the split across ranks
differs); a changed corpus, seed, seq_len or mixture is refused."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from align.data.collate import IGNORE_INDEX
from align.data.loader import StepBatch, resolve_rank
from align.data.mixture import source_picks
from align.data.order import epoch_order
from align.data.pretrain_corpus import Corpus, Split
from align.data.token_bins import BinStream, bin_row, bin_stream
from align.exceptions import ArtifactError, ConfigError

STATE_VERSION = 1


@dataclass(frozen=True)
class TokenLoaderConfig:
    """[loader] table of the pretraining stage."""

    seq_len: int = 256  # tokens per instance (one row of a micro-batch)
    micro_batch_size: int = 8  # instances per micro-batch
    grad_accum: int = 1
    epoch_tokens: int | None = None  # tokens per epoch of the mixture; None: the training split's size
    max_repetition: float = 4.0  # most times one source's documents may be used within one epoch
    # windows: fixed windows over the packed stream (no padding, documents split at window ends); greedy / ffd:
    # rows of whole pieces bin-packed as in SFT (align.data.token_bins: padding, no split of a fitting document)
    packing: Literal["windows", "greedy", "ffd"] = "windows"
    pad_id: int = 0  # greedy / ffd: id under attention_mask False

    def __post_init__(self):
        for name in ("seq_len", "micro_batch_size", "grad_accum"):
            if getattr(self, name) < 1 + (name == "seq_len"):
                raise ValueError(f"{name} must be >= {1 + (name == 'seq_len')}, got {getattr(self, name)}")
        if self.epoch_tokens is not None and self.epoch_tokens < self.seq_len:
            raise ValueError(f"epoch_tokens must be >= seq_len, got {self.epoch_tokens}")


@dataclass(frozen=True)
class EpochStream:
    docs: np.ndarray  # (n,) training-split documents in stream order (repeats allowed)
    ends: np.ndarray  # (n,) cumulative token count after each document
    instances: int


def mixture_documents(corpus: Corpus, cfg: TokenLoaderConfig, seed: int, epoch: int) -> np.ndarray:
    """The documents of one epoch in stream order (steps 1-2 of the module docstring; step 1 is align.data.mixture's
    rule, shared with the chat splits' mixtures)."""
    split = corpus.train
    budget = cfg.epoch_tokens or int(split.lengths.sum())
    members = [np.flatnonzero(split.source == s) for s in range(len(corpus.names))]
    picks = source_picks(members, split.lengths, corpus.weights, corpus.names, budget, cfg.max_repetition, seed,
                         epoch, unit="training tokens")
    docs = np.concatenate(picks)
    return docs[epoch_order(len(docs), seed, epoch)]


def window(split: Split, stream: EpochStream, k: int, seq_len: int) -> dict[str, np.ndarray]:
    """Instance k of an epoch: its tokens, document ids, positions and labels (each (seq_len,))."""
    lo, hi = k * seq_len, (k + 1) * seq_len
    first = int(np.searchsorted(stream.ends, lo, side="right"))  # the document holding token lo
    ids = np.empty(seq_len, dtype=np.int64)
    doc_ids = np.empty(seq_len, dtype=np.int64)
    positions = np.empty(seq_len, dtype=np.int64)
    labels = np.empty(seq_len, dtype=np.int64)
    t, d = 0, first
    while t < seq_len:
        begin = int(stream.ends[d - 1]) if d else 0
        start_in_doc = max(lo, begin) - begin
        take = min(int(stream.ends[d]), hi) - max(lo, begin)
        doc = int(stream.docs[d])
        ids[t:t + take] = split.tokens[split.starts[doc] + start_in_doc: split.starts[doc] + start_in_doc + take]
        doc_ids[t:t + take] = d - first
        positions[t:t + take] = np.arange(take)
        labels[t:t + take] = ids[t:t + take]
        if start_in_doc == 0:
            labels[t] = IGNORE_INDEX  # a document's first token is never a target (see the docstring)
        t, d = t + take, d + 1
    return {"input_ids": ids, "document_ids": doc_ids, "position_ids": positions, "labels": labels}


def collate_windows(windows: list[dict[str, np.ndarray]]) -> dict[str, torch.Tensor]:
    """Windows -> the packed batch layout of docs/CONTRACTS.md (no padding: every window is full)."""
    batch = {k: torch.from_numpy(np.stack([w[k] for w in windows])) for k in windows[0]}
    if "attention_mask" not in batch:  # a window is full; a bin row says where its padding is
        batch["attention_mask"] = torch.ones_like(batch["input_ids"], dtype=torch.bool)
    return batch


class TokenLoader:
    """`StepBatch`es of this rank over the token-addressed stream; `state_dict` is the token count consumed."""

    def __init__(self, corpus: Corpus, cfg: TokenLoaderConfig, seed: int, rank: int | None = None,
                 world_size: int | None = None, max_steps: int | None = None):
        self.corpus, self.cfg, self.seed = corpus, cfg, seed
        self.rank, self.world_size = resolve_rank(rank, world_size)
        self.tokens, self.step, self.max_steps = 0, 0, max_steps
        self._streams: dict[int, EpochStream] = {}
        self._epoch_starts = [0]  # global instance number at which epoch e starts, for the epochs seen so far
        if self.stream(0).instances == 0:
            raise ConfigError(f"loader.seq_len = {cfg.seq_len} is longer than an epoch of the corpus")

    @property
    def instances_per_step(self) -> int:
        return self.world_size * self.cfg.grad_accum * self.cfg.micro_batch_size

    def stream(self, epoch: int) -> EpochStream | BinStream:
        """Epoch `epoch`'s stream; the two most recently built are cached (a step spans at most two epochs)."""
        if epoch not in self._streams:
            cfg, split = self.cfg, self.corpus.train
            docs = mixture_documents(self.corpus, cfg, self.seed, epoch)
            if cfg.packing == "windows":
                ends = np.cumsum(split.lengths[docs])
                stream = EpochStream(docs, ends, int(ends[-1]) // cfg.seq_len)
            else:
                stream = bin_stream(split, docs, cfg.seq_len, cfg.packing, self.seed, epoch)
            self._streams = {e: s for e, s in self._streams.items() if e >= epoch - 1}
            self._streams[epoch] = stream
        return self._streams[epoch]

    def locate(self, instance: int) -> tuple[int, int]:
        """(epoch, index within it) of a global instance number. Epoch sizes are remembered once computed, so a
        resume deep into a run builds each earlier epoch's stream once, not once per instance."""
        while self._epoch_starts[-1] <= instance:
            self._epoch_starts.append(self._epoch_starts[-1] + self.stream(len(self._epoch_starts) - 1).instances)
        epoch = int(np.searchsorted(self._epoch_starts, instance, side="right")) - 1
        return epoch, instance - self._epoch_starts[epoch]

    def instance(self, index: int) -> dict[str, np.ndarray]:
        epoch, k = self.locate(index)
        if self.cfg.packing == "windows":
            return window(self.corpus.train, self.stream(epoch), k, self.cfg.seq_len)
        return bin_row(self.corpus.train, self.stream(epoch), k, self.cfg.seq_len, self.cfg.pad_id)

    def __iter__(self):
        cfg, g = self.cfg, self.instances_per_step
        while self.max_steps is None or self.step < self.max_steps:
            base = self.tokens // cfg.seq_len
            micro = [[base + m * cfg.micro_batch_size + i for i in range(cfg.micro_batch_size)]
                     for m in range(self.world_size * cfg.grad_accum)]
            mine = micro[self.rank::self.world_size]
            batches = [collate_windows([self.instance(i) for i in mb]) for mb in mine]
            epoch = self.locate(base)[0]
            step = StepBatch(micro_batches=batches, step=self.step, epoch=epoch, global_rows=g,
                             global_loss_tokens=self._loss_tokens(base, g))
            self.tokens, self.step = self.tokens + g * cfg.seq_len, self.step + 1  # advance before yielding
            yield step

    def _loss_tokens(self, base: int, count: int) -> int:
        """Label tokens of instances [base, base + count) after the shift: all but position 0 and doc starts."""
        total = 0
        for i in range(base, base + count):
            labels = self.instance(i)["labels"]
            total += int((labels[1:] != IGNORE_INDEX).sum())
        return total

    def state_dict(self) -> dict:
        return {"version": STATE_VERSION, "tokens": self.tokens, "step": self.step, "seed": self.seed,
                "corpus": self.corpus.digest, "order": self._order_identity()}

    def _order_identity(self) -> dict:
        return {"seq_len": self.cfg.seq_len, "epoch_tokens": self.cfg.epoch_tokens, "packing": self.cfg.packing,
                "weights": list(self.corpus.weights), "names": list(self.corpus.names)}

    def load_state_dict(self, state: dict) -> None:
        if state.get("version") != STATE_VERSION:
            raise ArtifactError(f"token loader state version {state.get('version')!r}, this code reads "
                                f"{STATE_VERSION}")
        for key, now in (("corpus", self.corpus.digest), ("seed", self.seed), ("order", self._order_identity())):
            if state[key] != now:
                raise ArtifactError(f"token loader state: {key} was {state[key]!r}, now {now!r}; resuming would not "
                                    "continue the same data order. Start a fresh run or restore it.")
        if state["tokens"] % self.cfg.seq_len:
            raise ArtifactError(f"token loader state: {state['tokens']} tokens is not a whole number of instances")
        self.tokens, self.step = state["tokens"], state["step"]


def heldout_batches(corpus: Corpus, seq_len: int, batch_size: int, max_windows: int) -> list[dict]:
    """The held-out split's documents in file order, back to back, as up to `max_windows` full windows (shorter
    windows when the whole split is under one window), in batches of `batch_size`."""
    split = corpus.heldout
    if len(split) == 0:
        raise ConfigError("corpus.heldout_every = 0 leaves no held-out documents for the in-loop perplexity")
    docs = np.arange(len(split), dtype=np.int64)
    ends = np.cumsum(split.lengths)
    width = min(seq_len, int(ends[-1]))
    stream = EpochStream(docs, ends, int(ends[-1]) // width)
    windows = [window(split, stream, k, width) for k in range(min(max_windows, stream.instances))]
    return [collate_windows(windows[i:i + batch_size]) for i in range(0, len(windows), batch_size)]
