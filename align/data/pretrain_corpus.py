"""Raw-text corpora for continued pretraining: documents from one or more sources, tokenised, with a held-out slice.

A source is a parquet or JSONL file with a text column, local or at a URL (align.data.readers, the same readers as
ingest), or several such files read in order (a glob `path`, or `urls`: a dataset's parquet shards). Every
document becomes `[BOS] + tokens(text) + [EOS]`: the EOS teaches where a document ends, and the pretraining order
(align.data.token_order) relies on it to read documents back to back. Every `heldout_every`-th document of each
source (by position in its files) is held out for the in-loop NLL / perplexity, never trained on.

A row whose text is missing, not a string or empty is a counted rejection naming its row; more than
`max_reject_fraction` of a source's rows rejected fails the source, as in ingest.

The corpus lives in memory (token arrays per split, document start offsets, the source of every document): a
corpus for this rung is what one host tokenises in minutes. `digest` identifies its content (tokens, document
boundaries, sources, weights), which a resumed run's data order is checked against.

With `[corpus.decontam]` every document is checked against the evaluation sets as ingest checks records
(align.data.decontam: n-gram overlap; flagged or dropped), the counts in each source's stats. `decontam.heldout`
does not apply here (a corpus has no held-out sources of an ingest config): name registered eval sets."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from align.data.decontam import DecontamConfig, Screen, load_references
from align.data.hub import HttpConfig
from align.data.readers import open_rows, source_files
from align.data.schema import Conversation, Message
from align.exceptions import DataError


@dataclass(frozen=True)
class CorpusSourceConfig:
    """[corpus.sources.<name>]: one raw-text source and its share of the training mixture."""

    path: str = ""  # a local file relative to the project root, or a glob; exactly one of path, url and urls
    url: str = ""
    urls: tuple[str, ...] = ()  # several URLs read in order (a dataset's parquet shards)
    file_type: str = "auto"  # "auto" (from the suffix), "parquet" or "jsonl"
    text_column: str = "text"
    weight: float = 1.0  # share of the training tokens of an epoch, relative to the other sources' weights
    max_docs: int | None = None  # read only the first max_docs rows
    http: HttpConfig = field(default_factory=HttpConfig)

    @property
    def location(self) -> str:
        """The path (or glob) or URL(s) as configured."""
        return self.url or self.path or " ".join(self.urls)

    def __post_init__(self):
        if sum(map(bool, (self.path, self.url, self.urls))) != 1:
            raise ValueError("a corpus source needs exactly one of path (a file or glob), url and urls")
        if not self.weight > 0:
            raise ValueError(f"weight must be > 0, got {self.weight}")
        if self.file_type not in ("auto", "parquet", "jsonl"):
            raise ValueError(f"file_type must be auto, parquet or jsonl, got {self.file_type!r}")


@dataclass(frozen=True)
class CorpusConfig:
    """[corpus] table."""

    sources: dict[str, CorpusSourceConfig] = field(default_factory=dict)
    heldout_every: int = 20  # every N-th document of each source is held out (0: none)
    max_reject_fraction: float = 0.01
    # [corpus.decontam]: documents checked against the evaluation sets (align.data.decontam); unset: not checked
    decontam: DecontamConfig | None = None

    def __post_init__(self):
        if not self.sources:
            raise ValueError("corpus.sources: at least one source is needed")
        if self.heldout_every < 0 or self.heldout_every == 1:
            raise ValueError(f"heldout_every must be 0 or >= 2, got {self.heldout_every}")


@dataclass(frozen=True)
class Split:
    """Documents back to back: document d is tokens[starts[d]:starts[d + 1]], from source `source[d]`."""

    tokens: np.ndarray  # (total,) int64
    starts: np.ndarray  # (docs + 1,) int64
    source: np.ndarray  # (docs,) int64: index into Corpus.names

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.starts)

    def __len__(self) -> int:
        return len(self.source)


@dataclass(frozen=True)
class Corpus:
    names: tuple[str, ...]  # sources, sorted
    weights: tuple[float, ...]
    train: Split
    heldout: Split
    stats: dict  # per source: rows, documents, tokens, rejected, the first rejections

    @property
    def digest(self) -> str:
        h = hashlib.sha256(repr((self.names, self.weights)).encode())
        for split in (self.train, self.heldout):
            for array in (split.tokens, split.starts, split.source):
                h.update(np.ascontiguousarray(array, dtype=np.int64).tobytes())
        return h.hexdigest()


def _split(docs: list[tuple[int, list[int]]]) -> Split:
    lengths = np.array([len(t) for _, t in docs], dtype=np.int64)
    tokens = np.concatenate([np.asarray(t, dtype=np.int64) for _, t in docs]) if docs else np.zeros(0, np.int64)
    return Split(tokens, np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
                 np.array([s for s, _ in docs], dtype=np.int64))


def _readers(name: str, src: CorpusSourceConfig, base: Path) -> list:
    """One reader per file of the source (a glob's matches or `urls`, in order), each holding the text column."""
    readers = [open_rows(path, url, src.file_type, src.http, base)
               for path, url in source_files(src.path, src.url, src.urls, base)]
    for reader in readers:
        if src.text_column not in reader.names():
            raise DataError(f"{reader.label}: missing text column {src.text_column!r} (corpus.sources.{name}."
                            f"text_column); columns present: {', '.join(reader.names()) or '(none)'}")
    return readers


def _read_source(index: int, name: str, src: CorpusSourceConfig, cfg: CorpusConfig, tokenizer, base: Path,
                 train: list, heldout: list, screen: Screen | None) -> dict:
    readers = _readers(name, src, base)
    reader = readers[0] if len(readers) == 1 else None  # names the source in errors
    label = reader.label if reader is not None else f"{base / src.path if src.path else ' '.join(src.urls)}"
    stats = {"rows": 0, "documents": 0, "tokens": 0, "rejected": 0, "rejections": []}
    rows = (row for r in readers for row in r.rows([src.text_column], 1024))
    for row_index, row in enumerate(rows):
        if src.max_docs is not None and row_index >= src.max_docs:
            break
        stats["rows"] += 1
        text = None if isinstance(row, Exception) else row[src.text_column]
        if not isinstance(text, str) or not text.strip():
            stats["rejected"] += 1
            if len(stats["rejections"]) < 20:
                why = str(row) if isinstance(row, Exception) else "missing, not a string, or empty"
                stats["rejections"].append({"row": row_index, "column": src.text_column, "reason": why})
            continue
        if screen is not None and not screen.keep(row_index, Conversation(f"{name}-{row_index}",
                                                                          (Message("user", text),))):
            continue  # an evaluation problem in the corpus, dropped (decontam.action = "drop"; counted there)
        ids = [tokenizer.bos_id, *tokenizer.encode(text), tokenizer.eos_id]
        held = cfg.heldout_every and stats["documents"] % cfg.heldout_every == cfg.heldout_every - 1
        (heldout if held else train).append((index, ids))
        stats["documents"] += 1
        stats["tokens"] += len(ids)
    if stats["rows"] == 0 or stats["documents"] == 0:
        raise DataError(f"{label}: no documents (corpus.sources.{name})")
    if stats["rejected"] / stats["rows"] > cfg.max_reject_fraction:
        first = stats["rejections"][0]
        raise DataError(f"{label}: {stats['rejected']} of {stats['rows']} rows rejected, more than "
                        f"{cfg.max_reject_fraction:.1%}; first: row {first['row']}, column {first['column']!r}: "
                        f"{first['reason']}")
    if screen is not None:
        stats["decontam"] = screen.report()
    if src.max_docs is not None:
        return {**stats, "sha256": None}
    if reader is not None:
        return {**stats, "sha256": reader.sha256()}
    return {**stats, "sha256": {r.label: r.sha256() for r in readers}}  # several files: each one's hash


def build_corpus(cfg: CorpusConfig, tokenizer, base_dir: str | Path = ".") -> Corpus:
    """Tokenise every source (sorted by name) into the training and held-out splits."""
    names = tuple(sorted(cfg.sources))
    train, heldout, stats = [], [], {}
    refs = None if cfg.decontam is None else load_references(cfg.decontam, {}, base_dir)
    for index, name in enumerate(names):
        src = cfg.sources[name]
        screen = None if refs is None else refs.screen(name, src.location)
        stats[name] = _read_source(index, name, src, cfg, tokenizer, Path(base_dir), train, heldout, screen)
    return Corpus(names, tuple(cfg.sources[n].weight for n in names), _split(train), _split(heldout), stats)
