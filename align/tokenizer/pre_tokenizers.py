"""tokenizer.json `pre_tokenizer` -> a function str -> list[str] (the words BPE runs on, in order).

Implemented: Split (every delimiter behaviour, invert), ByteLevel (GPT-2 regex and byte alphabet), Sequence.
The split semantics follow tokenizers' `NormalizedString::split` and `Pattern::find_matches`: matches and the
gaps between them form an ordered list, the behaviour folds delimiters into neighbours, empty pieces vanish.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from align.tokenizer.byte_level import BYTE_TO_CHAR, GPT2_PATTERN
from align.tokenizer.unicode_regex import compile_onig

PreTokenizer = Callable[[str], list[str]]
Piece = tuple[str, bool]  # (text, is_delimiter)

# Latin-1 char -> byte-alphabet char: lets str.translate do the byte mapping in C.
_LATIN1_TO_ALPHABET = {b: BYTE_TO_CHAR[b] for b in range(256)}


def build_pre_tokenizer(spec: dict | None, where: str) -> PreTokenizer | None:
    if spec is None:
        return None
    kind = spec.get("type")
    if kind == "Sequence":
        steps = [build_pre_tokenizer(s, f"{where}.pretokenizers[{i}]") for i, s in enumerate(spec["pretokenizers"])]
        return _sequence([s for s in steps if s is not None])
    if kind == "Split":
        return _split_pre_tokenizer(spec, where)
    if kind == "ByteLevel":
        return _byte_level(spec)
    raise NotImplementedError(f"{where}: pre_tokenizer type {kind!r} is not supported by align.tokenizer")


def _sequence(steps: list[PreTokenizer]) -> PreTokenizer | None:
    if not steps:
        return None
    if len(steps) == 1:
        return steps[0]

    def run(text: str) -> list[str]:
        words = [text]
        for step in steps:
            words = [w for word in words for w in step(word)]
        return words

    return run


def _split_pre_tokenizer(spec: dict, where: str) -> PreTokenizer:
    pattern = spec["pattern"]
    if "String" in pattern:
        regex = re.compile(re.escape(pattern["String"]))
    elif "Regex" in pattern:
        try:
            regex = compile_onig(pattern["Regex"])
        except NotImplementedError as exc:  # one error naming the field: the pattern is not run approximately
            raise NotImplementedError(f"{where}.pattern.Regex {pattern['Regex']!r} cannot be translated exactly "
                                      f"to Python's re: {exc}") from exc
    else:
        raise NotImplementedError(f"{where}: Split pattern {pattern!r}")
    behavior = spec.get("behavior", "Removed")
    if behavior not in _BEHAVIORS:
        raise NotImplementedError(f"{where}: Split behavior {behavior!r}")
    fold = _BEHAVIORS[behavior]
    invert = bool(spec.get("invert", False))
    return lambda text: split_text(text, regex, fold, invert)


def split_text(text: str, regex: re.Pattern[str], fold: Callable[[list[Piece]], list[Piece]],
               invert: bool) -> list[str]:
    if not text:
        return []
    pieces = find_matches(text, regex)
    if invert:
        pieces = [(t, not m) for t, m in pieces]
    return [t for t, _ in fold(pieces) if t]


def find_matches(text: str, regex: re.Pattern[str]) -> list[Piece]:
    pieces: list[Piece] = []
    prev = 0
    for m in regex.finditer(text):
        start, end = m.span()
        if prev != start:
            pieces.append((text[prev:start], False))
        pieces.append((text[start:end], True))
        prev = end
    if prev != len(text):
        pieces.append((text[prev:], False))
    return pieces


def _removed(pieces: list[Piece]) -> list[Piece]:
    return [p for p in pieces if not p[1]]


def _isolated(pieces: list[Piece]) -> list[Piece]:
    return pieces


def _merged_with_previous(pieces: list[Piece]) -> list[Piece]:
    out: list[Piece] = []
    previous_match = False
    for text, is_match in pieces:
        if is_match and not previous_match and out:
            out[-1] = (out[-1][0] + text, out[-1][1])
        else:
            out.append((text, is_match))
        previous_match = is_match
    return out


def _merged_with_next(pieces: list[Piece]) -> list[Piece]:
    out: list[Piece] = []
    previous_match = False
    for text, is_match in reversed(pieces):
        if is_match and not previous_match and out:
            out[-1] = (text + out[-1][0], out[-1][1])
        else:
            out.append((text, is_match))
        previous_match = is_match
    out.reverse()
    return out


def _contiguous(pieces: list[Piece]) -> list[Piece]:
    out: list[Piece] = []
    previous_match = False
    for text, is_match in pieces:
        if is_match == previous_match and out:
            out[-1] = (out[-1][0] + text, out[-1][1])
        else:
            out.append((text, is_match))
        previous_match = is_match
    return out


_BEHAVIORS = {"Removed": _removed, "Isolated": _isolated, "MergedWithPrevious": _merged_with_previous,
              "MergedWithNext": _merged_with_next, "Contiguous": _contiguous}


def _byte_level(spec: dict) -> PreTokenizer:
    add_prefix_space = bool(spec.get("add_prefix_space", True))
    regex = compile_onig(GPT2_PATTERN) if spec.get("use_regex", True) else None
    table = _LATIN1_TO_ALPHABET

    def run(text: str) -> list[str]:
        if not text:
            return []
        if add_prefix_space and not text.startswith(" "):
            text = " " + text
        words = split_text(text, regex, _isolated, False) if regex is not None else [text]
        return [w.encode("utf-8").decode("latin-1").translate(table) for w in words]

    return run
