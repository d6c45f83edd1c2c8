"""tokenizer.json `normalizer` -> a function str -> str, applied to each text segment between added tokens."""

from __future__ import annotations

import unicodedata
from collections.abc import Callable

from align.tokenizer.compose import pipe
from align.tokenizer.unicode_regex import compile_onig

Normalizer = Callable[[str], str]


def build_normalizer(spec: dict | None, where: str) -> Normalizer | None:
    """`where` names the JSON path in error messages (e.g. "tokenizer.json: normalizer")."""
    if spec is None:
        return None
    kind = spec.get("type")
    if kind == "Sequence":
        steps = [build_normalizer(s, f"{where}.normalizers[{i}]") for i, s in enumerate(spec["normalizers"])]
        kept = [s for s in steps if s is not None]
        return pipe(kept) if kept else None
    if kind == "Prepend":
        prefix = spec["prepend"]
        # tokenizers prepends only to a non-empty segment
        return lambda s: prefix + s if s else s
    if kind == "Replace":
        return _replace(spec, where)
    if kind in ("NFC", "NFD", "NFKC", "NFKD"):
        # NOTE: unicodedata is Unicode 14 on Python 3.11; characters newer than that normalise as unassigned.
        return lambda s, form=kind: unicodedata.normalize(form, s)
    if kind == "Lowercase":
        return str.lower
    raise NotImplementedError(f"{where}: normalizer type {kind!r} is not supported by align.tokenizer")


def _replace(spec: dict, where: str) -> Normalizer:
    pattern, content = spec["pattern"], spec["content"]
    if "String" in pattern:
        literal = pattern["String"]
        return lambda s: s.replace(literal, content)
    if "Regex" in pattern:
        regex = compile_onig(pattern["Regex"])
        return lambda s: regex.sub(lambda _m: content, s)
    raise NotImplementedError(f"{where}: Replace pattern {pattern!r}")
