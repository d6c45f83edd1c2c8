"""Translate the Oniguruma regexes found in tokenizer.json (pre-tokenizer splits) into stdlib `re` patterns.

`tokenizers` runs these patterns with Oniguruma, where `\\p{L}` is a Unicode property and `\\s` is the Unicode
White_Space set. The stdlib `re` has no `\\p{..}`, and its `\\s` is `str.isspace()`, which also matches
U+001C..U+001F (not White_Space). So the translator expands `\\p{..}`/`\\s`/`\\d` into explicit character
classes built from `unicodedata`. Anything it cannot translate exactly raises NotImplementedError.

Known limit (exactness): the classes come from this Python's `unicodedata` (Unicode 14.0 on 3.11), while the
Oniguruma bundled with `tokenizers` may know a newer Unicode version. Characters assigned after Unicode 14 (e.g.
CJK Extension H, U+31350..U+323AF) are category Cn here and are classified differently from `tokenizers`.
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata

# Unicode White_Space property (PropList.txt), which is what Oniguruma's \s matches on Unicode strings.
_WHITE_SPACE = r"\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"

# Escapes whose Oniguruma meaning differs from `re` (or that `re` lacks); refusing beats approximating.
_REFUSED_ESCAPES = set("wWbBhHRXKGzZyYO")

_GENERAL_CATEGORIES = {
    "L", "Lu", "Ll", "Lt", "Lm", "Lo", "M", "Mn", "Mc", "Me", "N", "Nd", "Nl", "No",
    "P", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "S", "Sm", "Sc", "Sk", "So", "Z", "Zs", "Zl", "Zp",
}
_CATEGORY_ALIASES = {"Letter": "L", "Mark": "M", "Number": "N", "Punctuation": "P", "Symbol": "S",
                     "Separator": "Z"}


@functools.lru_cache(maxsize=1)
def _category_runs() -> dict[str, list[tuple[int, int]]]:
    """Maximal runs of code points per two-letter general category (one pass over all code points)."""
    category = unicodedata.category
    runs: dict[str, list[tuple[int, int]]] = {}
    start, current = 0, category(chr(0))
    for cp in range(1, sys.maxunicode + 2):
        cat = category(chr(cp)) if cp <= sys.maxunicode else ""
        if cat != current:
            runs.setdefault(current, []).append((start, cp - 1))
            start, current = cp, cat
    return runs


def _escape_cp(cp: int) -> str:
    return f"\\U{cp:08x}" if cp > 0xFFFF else f"\\u{cp:04x}"


@functools.lru_cache(maxsize=None)
def category_class_body(name: str) -> str:
    """The inside of a `[...]` class matching general category `name` (one or two letters)."""
    name = _CATEGORY_ALIASES.get(name, name)
    if name not in _GENERAL_CATEGORIES:
        raise NotImplementedError(f"Unicode property \\p{{{name}}} (only general categories are supported)")
    ranges = sorted(r for cat, rs in _category_runs().items() if cat.startswith(name) for r in rs)
    merged: list[list[int]] = []
    for lo, hi in ranges:
        if merged and lo == merged[-1][1] + 1:
            merged[-1][1] = hi
        else:
            merged.append([lo, hi])
    return "".join(_escape_cp(lo) if lo == hi else f"{_escape_cp(lo)}-{_escape_cp(hi)}" for lo, hi in merged)


def _escape_body(pattern: str, i: int) -> tuple[str, bool, int]:
    """At a backslash at `i`: (class body, negated, next index) for \\p \\P \\s \\S \\d, else ("", False, i)."""
    kind = pattern[i + 1] if i + 1 < len(pattern) else ""
    if kind in ("p", "P"):
        if pattern.startswith("{", i + 2):
            end = pattern.index("}", i + 2)
            name, nxt = pattern[i + 3:end], end + 1
        else:
            name, nxt = pattern[i + 2:i + 3], i + 3
        negated = kind == "P"
        if name.startswith("^"):
            name, negated = name[1:], not negated
        return category_class_body(name), negated, nxt
    if kind in ("s", "S"):
        return _WHITE_SPACE, kind == "S", i + 2
    if kind == "d":
        return category_class_body("Nd"), False, i + 2
    if kind == "D":
        return category_class_body("Nd"), True, i + 2
    if kind in _REFUSED_ESCAPES or pattern.startswith("x{", i + 1):
        raise NotImplementedError(f"regex escape \\{kind} (its Oniguruma meaning has no exact `re` equivalent)")
    return "", False, i


def translate(pattern: str) -> str:
    """Oniguruma pattern (as stored in tokenizer.json) -> equivalent stdlib `re` pattern."""
    out: list[str] = []
    i, n = 0, len(pattern)
    in_class = False
    while i < n:
        c = pattern[i]
        if c == "\\":
            body, negated, nxt = _escape_body(pattern, i)
            if nxt == i:  # an ordinary escape (\r, \[, \., ...): same meaning in both engines
                out.append(pattern[i:i + 2])
                i += 2
                continue
            if in_class:
                if negated:
                    raise NotImplementedError("a negated property (\\P, \\S, \\D) inside a character class")
                out.append(body)
            else:
                out.append(("[^" if negated else "[") + body + "]")
            i = nxt
            continue
        if in_class:
            if c == "[" or pattern.startswith("&&", i):
                raise NotImplementedError("nested character classes or class intersection (&&)")
            if c == "]":
                in_class = False
            out.append(c)
            i += 1
            continue
        if c == "[":
            in_class = True
            j = i + 1
            if pattern.startswith("^", j):
                j += 1
            if pattern.startswith("]", j):  # a leading ] is a literal in both engines
                j += 1
            out.append(pattern[i:j])
            i = j
            continue
        out.append(c)
        i += 1
    return "".join(out)


@functools.lru_cache(maxsize=32)
def compile_onig(pattern: str) -> re.Pattern[str]:
    """Translate and compile; cached because the expanded classes make compilation cost milliseconds."""
    return re.compile(translate(pattern))
