"""Decontamination: every ingested record checked against the evaluation sets by normalised word n-gram overlap.

Normalisation: NFKC, case folded, the text read as words = runs of letters or runs of digits; everything else
(punctuation, spacing, case, "has5" vs "has 5") does not matter. A reference item (one evaluation problem: the
user turns of a registered eval set's record, align.data.evalsets, or of a held-out source of the same ingest config)
is the set of its word n-grams; an item shorter than n words is one gram of all its words.

A training record's text (every message, a pair's chosen and rejected, a solution's steps) overlaps item r by the
fraction of r's n-grams that occur in it. An overlap >= `threshold` with any item is a match: the record holds that
problem (re-cased, re-spaced, re-punctuated, inside a longer text, or with a few words changed at its ends). A
paraphrase that changes words throughout escapes any n-gram test; this one is no exception.

Defaults: n = 8, threshold = 0.8. The bundled task's problems are templated: a training problem and a held-out one
can differ in one number only, and score up to 0.67 at n = 8 (0.43 at n = 13); they are different problems (held-out
keys are disjoint), and 0.8 keeps them apart while a copy scores 1.0.

Matches are flagged (kept, counted and listed in the manifest) or dropped, per `action`. A source that is itself a
reference (the same path or URL as a registered eval set, or named in `heldout`) is not checked against itself.

Speed: the references are one dict from n-gram (a tuple of words, hashed) to the items holding it; a record costs
one regex pass, its grams as a set, and a set intersection with the dict's keys (bench/decontam.py)."""

from __future__ import annotations

import re
import unicodedata
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Literal

from align.data.evalsets import get_evalset
from align.data.ingest_parquet import SourceConfig, column_plan, iter_rows
from align.data.readers import open_rows
from align.data.schema import Conversation, OutcomePrompt, PreferencePair, Record, RowError, StepLabelled, validate
from align.data.sources import make_records
from align.exceptions import ConfigError, DataError

MAX_LISTED = 1000  # flagged ids listed in a manifest
_WORD = re.compile(r"\d+|[^\W\d_]+")


@dataclass(frozen=True)
class DecontamConfig:
    """[decontam] of ingest.toml."""

    evalsets: tuple[str, ...] = ("bundled",)  # registered eval sets (align.data.evalsets) every source is checked on
    heldout: tuple[str, ...] = ()  # sources of this config that are held out: references, never checked themselves
    n: int = 8  # words per gram
    threshold: float = 0.8  # fraction of an eval item's grams found in a record that makes it a match
    action: Literal["flag", "drop"] = "flag"  # flag: keep and report; drop: leave the record out (counted)
    max_examples: int = 10  # matches shown in the manifest (row, id, reference item, overlap, text)

    def __post_init__(self):
        if self.n < 1:
            raise ValueError(f"decontam.n must be >= 1, got {self.n}")
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"decontam.threshold must be in (0, 1], got {self.threshold}")
        if self.max_examples < 0:
            raise ValueError(f"decontam.max_examples must be >= 0, got {self.max_examples}")


def words(text: str) -> list[str]:
    if not text.isascii():  # NFKC leaves ASCII as it is: skip it for the common case
        text = unicodedata.normalize("NFKC", text)
    return _WORD.findall(text.casefold())


def grams(tokens: list[str], n: int) -> set[tuple[str, ...]]:
    """The word n-grams of `tokens`; fewer than n words: the whole as one gram (none for no words)."""
    if len(tokens) < n:
        return {tuple(tokens)} if tokens else set()
    return {tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)}


def record_texts(record: Record) -> list[str]:
    """Everything of a record a model would read or learn: each text apart (no gram spans two of them)."""
    if isinstance(record, Conversation):
        return [m.content for m in record.messages]
    texts = [m.content for m in record.prompt]
    if isinstance(record, PreferencePair):
        return texts + [record.chosen, record.rejected]
    if isinstance(record, StepLabelled):
        return texts + list(record.steps)
    return texts


def problem_text(record: Record) -> str:
    """What an evaluation asks: the user turns (an eval set's records are prompts; a held-out source may be SFT)."""
    turns = record.messages if isinstance(record, Conversation) else record.prompt
    return "\n".join(m.content for m in turns if m.role == "user")


@dataclass(frozen=True)
class Match:
    reference: str  # "<set>:<item id>"
    overlap: float


class References:
    """The reference items of one ingest config, indexed by n-gram."""

    def __init__(self, cfg: DecontamConfig, items: Iterable[tuple[str, str]], counts: dict[str, int],
                 locations: dict[str, str]):
        self.cfg, self.counts, self.locations = cfg, counts, locations  # locations: path or URL -> set name
        self.labels: list[str] = []
        self.sizes: list[int] = []
        self.index: dict[tuple[str, ...], list[int]] = defaultdict(list)
        lengths = set()
        for label, text in items:
            item = grams(words(text), cfg.n)
            if not item:
                continue
            for gram in item:
                self.index[gram].append(len(self.labels))
            lengths.add(len(next(iter(item))))
            self.labels.append(label)
            self.sizes.append(len(item))
        self.index = dict(self.index)
        self.lengths = sorted(lengths)  # gram lengths to cut a record into: n, and any shorter item's length

    def match(self, record: Record) -> Match | None:
        """The reference item `record` overlaps most, if the overlap reaches the threshold."""
        found: set[tuple[str, ...]] = set()
        for text in record_texts(record):
            tokens = words(text)
            for length in self.lengths:
                found |= grams(tokens, length) if len(tokens) >= length else set()
        hits = Counter(i for gram in found & self.index.keys() for i in self.index[gram])
        best, overlap = None, 0.0
        for i, count in hits.items():
            if count / self.sizes[i] > overlap:
                best, overlap = i, count / self.sizes[i]
        if best is None or overlap < self.cfg.threshold:
            return None
        return Match(self.labels[best], overlap)

    def screen(self, name: str, location: str) -> Screen:
        """The check of one source's records (`location`: its path or URL as configured); a source that is a
        reference (held out, or the file of an eval set) is not checked against itself."""
        if name in self.cfg.heldout:
            return Screen(self, skipped=f"source {name!r} is held out (decontam.heldout): it is a reference")
        if location in self.locations:
            return Screen(self, skipped=f"source {name!r} is the evaluation set {self.locations[location]!r}")
        return Screen(self)


@dataclass
class Screen:
    """Per source: which records match, what became of them; `report()` is the manifest's `decontam`."""

    refs: References
    skipped: str | None = None
    checked: int = 0
    matched: int = 0
    dropped: int = 0
    flagged_ids: list[str] = field(default_factory=list)
    examples: list[dict] = field(default_factory=list)
    by_reference: Counter = field(default_factory=Counter)

    def keep(self, row: int, record: Record) -> bool:
        """False when the record matches and the action is drop."""
        if self.skipped is not None:
            return True
        self.checked += 1
        hit = self.refs.match(record)
        if hit is None:
            return True
        self.matched += 1
        self.by_reference[hit.reference.split(":", 1)[0]] += 1
        if len(self.examples) < self.refs.cfg.max_examples:
            self.examples.append({"row": row, "id": record.id, "reference": hit.reference,
                                  "overlap": round(hit.overlap, 4), "text": record_texts(record)[0][:200]})
        if self.refs.cfg.action == "drop":
            self.dropped += 1
            return False
        if len(self.flagged_ids) < MAX_LISTED:
            self.flagged_ids.append(record.id)
        return True

    def report(self) -> dict:
        cfg = self.refs.cfg
        out = {"n": cfg.n, "threshold": cfg.threshold, "action": cfg.action, "references": dict(self.refs.counts)}
        if self.skipped is not None:
            return {**out, "skipped": self.skipped, "checked": 0, "matched": 0, "dropped": 0}
        return {**out, "checked": self.checked, "matched": self.matched, "dropped": self.dropped,
                "matched_by_set": dict(sorted(self.by_reference.items())), "examples": self.examples,
                "flagged_ids": self.flagged_ids}


def _items(set_name: str, src: SourceConfig, base: Path) -> list[tuple[str, str]]:
    """(label, problem text) of every valid row of a reference source (its own ingest reports the invalid ones)."""
    reader = open_rows(src.path, src.url, src.file_type, src.http, base)
    plan = column_plan(src, reader)
    out = []
    for index, row in enumerate(iter_rows(reader, plan, src.batch_rows)):
        if src.max_rows is not None and index >= src.max_rows:
            break
        if isinstance(row, RowError):
            continue
        rid = str(row["_id"]) if row.get("_id") is not None else f"{set_name}-{index}"
        try:
            records = [validate(r) for r in make_records(src.format, src.kind, row, rid, "")]
        except RowError:
            continue
        out += [(f"{set_name}:{r.id}", problem_text(r)) for r in records]
    if not out:
        raise DataError(f"{reader.label}: the reference set {set_name!r} has no readable problems")
    return out


def load_references(cfg: DecontamConfig, sources: dict[str, SourceConfig], base_dir: str | Path) -> References:
    """The items of `cfg.evalsets` (as registered) and of the held-out `sources` named in `cfg.heldout`."""
    unknown = sorted(set(cfg.heldout) - set(sources))
    if unknown:
        raise ConfigError(f"decontam.heldout: {unknown[0]!r} is not a configured source; configured: "
                          f"{', '.join(sorted(sources)) or '(none)'}")
    base, items, counts, locations = Path(base_dir), [], {}, {}
    named = [(name, get_evalset(name).source) for name in cfg.evalsets] + \
            [(f"heldout:{name}", sources[name]) for name in cfg.heldout]
    for set_name, src in named:
        found = _items(set_name, src, base)
        items += found
        counts[set_name] = len(found)
        locations.setdefault(src.location, set_name)
    return References(cfg, items, counts, locations)
