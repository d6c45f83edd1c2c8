"""Boxes in a model response: the last `\\boxed{...}` / `\\fbox{...}` (or `\\boxed 5`), with boxes that sit next
to it (separated only by commas, "and", "or", spacing, `$`) joined into one list answer (response.py uses them).

Brace matching is a loop, not recursion, and each character is visited a bounded number of times: a box's content
is skipped as a whole once matched, so boxes nested inside it are not counted again. An unclosed box (a response
cut mid-answer) is unreadable.
"""

from __future__ import annotations

import re
from typing import NamedTuple

_BOX = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])\s*")
_BARE_ARG = re.compile(r"[^\s$]+")
_STRUCTURAL = re.compile(r"\\.|[{}]", re.DOTALL)
# What may separate two boxes of one answer: "\boxed{1}, \boxed{2}", "$\boxed{3}$ or $\boxed{4}$".
_SEPARATOR = re.compile(
    r"(?:\s|[,;&$]|\\[(),;:! ]|\\quad|\\qquad|\\\\|\band\b|\bor\b|\\text\{\s*(?:(?:and|or|,)\s*)?\})*")


class Box(NamedTuple):
    start: int
    end: int  # index after the box
    content: str | None  # None: unclosed


def _match_brace(text: str, open_at: int) -> int:
    """Index of the `}` closing the `{` at open_at, or -1. `\\{` and `\\}` are not structural. The regex jumps
    over ordinary characters in C; the loop runs once per brace or backslash."""
    depth = 0
    for m in _STRUCTURAL.finditer(text, open_at):
        c = m.group()
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return m.start()
    return -1


def find_boxes(text: str) -> list[Box]:
    boxes: list[Box] = []
    pos = 0
    while True:
        m = _BOX.search(text, pos)
        if m is None:
            return boxes
        at = m.end()
        if at < len(text) and text[at] == "{":
            close = _match_brace(text, at)
            if close < 0:
                boxes.append(Box(m.start(), len(text), None))
                return boxes
            boxes.append(Box(m.start(), close + 1, text[at + 1:close]))
            pos = close + 1
        else:
            bare = _BARE_ARG.match(text, at)
            content = bare.group() if bare else ""
            boxes.append(Box(m.start(), at + len(content), content))
            pos = at + len(content)


def final_group(text: str, boxes: list[Box]) -> list[Box]:
    """The last box and the boxes directly before it that only separators divide from it."""
    first = len(boxes) - 1
    while first > 0 and _SEPARATOR.fullmatch(text, boxes[first - 1].end, boxes[first].start):
        first -= 1
    return boxes[first:]


def join_group(contents: list[str]) -> str:
    """One answer from the contents of adjacent boxes (or math spans): itself, or the list of the distinct ones."""
    distinct = list(dict.fromkeys(c.strip() for c in contents))  # the same box repeated is one answer
    return ", ".join(distinct)  # a list, in written order: ordered unless the gold is a set
