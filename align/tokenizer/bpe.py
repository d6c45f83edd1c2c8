"""The BPE model of a tokenizer.json: initial symbols (characters, byte fallback, unknown token), the merge loop,
`ignore_merges`, and a bounded word cache.

Speed comes from caching and from cutting words where no merge can reach across. A cut between characters x and
y is exact when no piece any merge produces contains "xy" (the set of such two-character strings is computed from
the merges at load): every token BPE can emit is then on one side of the cut, and merges on one side never look
at the other. Two uses of that fact:
- a SentencePiece-style text (one long pre-token, `▁` for spaces) is cut with a C-speed regex before every `▁`
  that follows another character, when the vocabulary allows it (Mistral's does), and the pieces are cached;
- a piece not in the cache is cut at every exact boundary before merging (code such as `self.assertEqual(x,`
  falls into `self`, `.`, `assert`, ...), so the merge loop only ever runs on short, often-repeated parts.
Both are exact, not heuristics; when a vocabulary breaks the conditions the text is merged whole (exact, slower).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import chain

from align.exceptions import ArtifactError
from align.tokenizer.bpe_merge import ID_MASK, build_table, merge, merge_traced

SPACE_MARK = "\u2581"
# A chunk: a run of ▁ with the non-▁ characters after it, or non-▁ characters at the start of a pre-token.
_CHUNK_RE = re.compile(f"{SPACE_MARK}+[^{SPACE_MARK}]*|[^{SPACE_MARK}]+")


@dataclass(frozen=True)
class BpeCacheConfig:
    """Bounds of the word cache (memory is at most about max_entries x max_word_chars characters)."""

    max_entries: int = 65536  # the cache is emptied when it reaches this many words
    max_word_chars: int = 256  # longer words are never cached (a 10,000-character word would pin memory)


def parse_merges(raw: list, source: str) -> list[tuple[str, str]]:
    """tokenizer.json merges: `[["a", "b"], ...]` (current format) or `["a b", ...]` (older format)."""
    merges: list[tuple[str, str]] = []
    for n, item in enumerate(raw):
        if isinstance(item, str):
            parts = item.split(" ")
        else:
            parts = list(item)
        if len(parts) != 2 or not all(isinstance(p, str) for p in parts):
            raise ArtifactError(f"{source}: model.merges[{n}] = {item!r}: expected a pair of tokens")
        merges.append((parts[0], parts[1]))
    return merges


class BpeModel:
    """Word -> ids for one BPE vocabulary. `protected` tokens (special added tokens) are never produced by the
    `ignore_merges` whole-word lookup, so text that merely spells `[INST]` cannot become the control token."""

    def __init__(self, spec: dict, source: str, protected: set[str], cache: BpeCacheConfig = BpeCacheConfig()):
        _refuse_unsupported(spec, source)
        self.vocab: dict[str, int] = dict(spec["vocab"])
        merges = parse_merges(spec.get("merges", []), source)
        self._table = build_table(_merge_ids(merges, self.vocab, source))
        self.unk_token: str | None = spec.get("unk_token")
        if self.unk_token is not None and self.unk_token not in self.vocab:
            raise ArtifactError(f"{source}: model.unk_token {self.unk_token!r} is not in the vocab")
        self.byte_fallback = bool(spec.get("byte_fallback", False))
        self.fuse_unk = bool(spec.get("fuse_unk", False))
        self._source = source
        self._whole: dict[str, int] | None = None
        if spec.get("ignore_merges", False):
            self._whole = {t: i for t, i in self.vocab.items() if t not in protected}
        self._byte_ids = [self.vocab.get(f"<0x{b:02X}>") for b in range(256)]
        # single characters of the vocab -> id: the initial symbols of almost every word
        self._chars = {t: i for t, i in self.vocab.items() if len(t) == 1}
        # two-character strings inside some merge result: a cut between x and y is exact iff "xy" is not here
        self._bigrams = {piece[i:i + 2] for a, b in merges for piece in (a + b,) for i in range(len(piece) - 1)}
        special_symbols = {f"<0x{b:02X}>" for b in range(256)} | {self.unk_token}
        self._cut_parts = not any(a in special_symbols or b in special_symbols for a, b in merges)
        crosses = any(x + SPACE_MARK in self._bigrams for x in self._chars if x != SPACE_MARK)
        self._chunk_re = _CHUNK_RE if SPACE_MARK in self.vocab and not crosses and self._cut_parts else None
        self._cache: dict[str, tuple[int, ...]] = {}
        self._cache_cfg = cache

    def tokenize(self, word: str) -> list[int]:
        """Ids of one pre-token."""
        if self._whole is not None:
            whole = self._whole.get(word)
            if whole is not None:
                return [whole]
        if self._chunk_re is None:
            return list(self.word_ids(word))
        get = self._cache.get
        word_ids = self.word_ids
        return list(chain.from_iterable([get(c) or word_ids(c) for c in self._chunk_re.findall(word)]))

    def trace(self, word: str, built: set[int]) -> list[int]:
        """`tokenize(word)` uncached, adding to `built` every symbol the merge loop holds on the way (its initial
        symbols and each merge result): what a trimmed vocabulary must keep to encode `word` alike
        (align.tokenizer.trim). The chunk cut is exact, so tracing chunks traces the word."""
        if self._whole is not None and (whole := self._whole.get(word)) is not None:
            built.add(whole)
            return [whole]
        chunks = self._chunk_re.findall(word) if self._chunk_re is not None else [word]
        return list(chain.from_iterable(merge_traced(self._initial_ids(c), self._table, built) for c in chunks))

    def word_ids(self, word: str) -> tuple[int, ...]:
        """Ids of `word` merged as a standalone word (cached). A word is never empty, nor is its tuple."""
        cached = self._cache.get(word)
        if cached is not None:
            return cached
        parts = self._exact_parts(word) if self._cut_parts and len(word) > 1 else None
        if parts is None:
            return self._store(word, tuple(merge(self._initial_ids(word), self._table)))
        get, table, initial, store = self._cache.get, self._table, self._initial_ids, self._store
        # parts have no exact cut left: merge them directly (and cache them: they repeat across words)
        ids = tuple(chain.from_iterable([get(p) or store(p, tuple(merge(initial(p), table))) for p in parts]))
        return self._store(word, ids)

    def _store(self, word: str, ids: tuple[int, ...]) -> tuple[int, ...]:
        if len(word) <= self._cache_cfg.max_word_chars:
            if len(self._cache) >= self._cache_cfg.max_entries:
                self._cache.clear()  # bounded memory; a refill costs one merge per distinct word
            self._cache[word] = ids
        return ids

    def _exact_parts(self, word: str) -> list[str] | None:
        """`word` cut at every exact boundary, or None when there is none. Unknown characters (byte fallback,
        <unk> runs that fuse_unk joins) stay attached to their neighbours."""
        bigrams, chars = self._bigrams, self._chars
        cuts = [i for i in range(1, len(word)) if word[i - 1:i + 1] not in bigrams]
        cuts = [i for i in cuts if word[i] in chars and word[i - 1] in chars]
        if not cuts:
            return None
        bounds = [0, *cuts, len(word)]
        return [word[a:b] for a, b in zip(bounds, bounds[1:])]

    def cache_size(self) -> int:
        return len(self._cache)

    def _initial_ids(self, word: str) -> list[int]:
        chars = self._chars
        try:
            return [chars[ch] for ch in word]
        except KeyError:
            return self._initial_ids_slow(word)

    def _initial_ids_slow(self, word: str) -> list[int]:
        """Per character: its token, else its UTF-8 bytes as <0xXX> tokens, else <unk> (one per run if fuse_unk)."""
        chars = self._chars
        ids: list[int] = []
        unk_open = False  # the last symbol is an unknown-token run that fuse_unk may extend
        for ch in word:
            if ch in chars:
                ids.append(chars[ch])
                unk_open = False
                continue
            if self.byte_fallback:
                pieces = [self._byte_ids[b] for b in ch.encode("utf-8")]
                if None not in pieces:
                    ids.extend(pieces)
                    unk_open = False
                    continue
            if self.unk_token is None:
                raise ValueError(f"{self._source}: character {ch!r} (U+{ord(ch):04X}) has no token, no byte "
                                 f"fallback and the model has no unk_token")
            if not (unk_open and self.fuse_unk):
                ids.append(self.vocab[self.unk_token])
            unk_open = True
        return ids


def _merge_ids(merges: list[tuple[str, str]], vocab: dict[str, int], source: str) -> list[tuple[int, int, int]]:
    if vocab and max(vocab.values()) > ID_MASK:
        raise NotImplementedError(f"{source}: token ids above {ID_MASK} (the merge table packs ids in 21 bits)")
    out = []
    for rank, (a, b) in enumerate(merges):
        if a not in vocab or b not in vocab or a + b not in vocab:
            raise ArtifactError(f"{source}: model.merges[{rank}] = {[a, b]!r} uses a token not in the vocab")
        out.append((vocab[a], vocab[b], vocab[a + b]))
    return out


def _refuse_unsupported(spec: dict, source: str) -> None:
    if spec.get("type", "BPE") != "BPE":
        raise NotImplementedError(f"{source}: model.type {spec.get('type')!r} (align.tokenizer implements BPE)")
    if spec.get("dropout") not in (None, 0, 0.0):
        raise NotImplementedError(f"{source}: model.dropout={spec['dropout']!r} (BPE dropout is random)")
    for key in ("continuing_subword_prefix", "end_of_word_suffix"):
        if spec.get(key):
            raise NotImplementedError(f"{source}: model.{key}={spec[key]!r}")
    if not isinstance(spec.get("vocab"), dict):
        raise ArtifactError(f"{source}: model.vocab must be an object of token -> id")
