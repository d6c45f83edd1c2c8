"""Math answer verification: exact, bounded, pure stdlib. See docs/ARCHITECTURE.md (## verify).

    are_equivalent(gold, pred) -> True | False | None   (None: the gold itself cannot be read)
    is_readable(answer) -> bool
    extract_answer(response, fallback=False) -> str | None
"""

from __future__ import annotations

from align.verify.answer import make_budget, read_answer, unbox
from align.verify.config import DEFAULT_CONFIG, VerifyConfig
from align.verify.equiv import values_equal
from align.verify.limits import Unreadable
from align.verify.response import Extraction, extract
from align.verify.units import unit_of

__all__ = ["VerifyConfig", "DEFAULT_CONFIG", "Unreadable", "Extraction", "are_equivalent", "is_readable",
           "extract_answer", "extract", "read_answer", "compare", "compare_answers", "answer_of", "why_unreadable"]


def answer_of(text: str, config: VerifyConfig = DEFAULT_CONFIG) -> str | None:
    """The final answer of a bare answer, a math span, a boxed answer or a whole solution text (response.py)."""
    return extract(text, config.max_response_chars, True, lambda s: why_unreadable(s, config) is None).answer


def compare(gold: str, pred: str, config: VerifyConfig = DEFAULT_CONFIG) -> tuple[bool | None, str]:
    """(verdict, reason): verdict None when the gold is unreadable, False when the prediction is; reason says why.
    Either side may be an answer or a whole response: its final answer is taken first (answer_of)."""
    # Where no step finds an answer, the text itself is read, so the reason says what in it cannot be read.
    g, p = answer_of(gold, config), answer_of(pred, config)
    return compare_answers(gold if g is None else g, pred if p is None else p, config)


def compare_answers(gold: str, pred: str, config: VerifyConfig = DEFAULT_CONFIG) -> tuple[bool | None, str]:
    """compare() on two already extracted answers (the GRPO reward extracts with its own, stricter, rule)."""
    try:
        g = read_answer(unbox(gold), config)
    except Unreadable as e:
        return None, f"gold unreadable ({type(e).__name__}: {e})"
    try:
        p = read_answer(unbox(pred), config)
    except Unreadable as e:
        return False, f"prediction unreadable ({type(e).__name__}: {e})"
    if config.units == "match" and unit_of(gold) and unit_of(gold) != unit_of(pred):
        return False, f"units differ ({unit_of(gold)!r} asked, {unit_of(pred) or 'none'!r} given)"
    try:
        same = values_equal(g, p, config, make_budget(config, compare=True))
    except Unreadable as e:  # the comparison itself went over budget (huge cross-multiplication)
        return False, f"comparison refused ({e})"
    return same, "equal" if same else "different"


def are_equivalent(gold: str, pred: str, config: VerifyConfig = DEFAULT_CONFIG) -> bool | None:
    """Does `pred` match `gold` (answers or whole responses)? None when `gold` cannot be read (never 1)."""
    return compare(gold, pred, config)[0]


def why_unreadable(text: str, config: VerifyConfig = DEFAULT_CONFIG) -> str | None:
    """None when this answer string (or boxed answer) can be checked, else the reason it cannot."""
    try:
        read_answer(unbox(text), config)
        return None
    except Unreadable as e:
        return f"{type(e).__name__}: {e}"


def is_readable(text: str, config: VerifyConfig = DEFAULT_CONFIG) -> bool:
    """Can this answer string (or a boxed answer) be checked at all?"""
    return why_unreadable(text, config) is None


def extract_answer(response: str, fallback: bool = False, config: VerifyConfig = DEFAULT_CONFIG) -> str | None:
    """The text of the response's final answer (adjacent boxes joined as a set), or None when there is none."""
    return extract(response, config.max_response_chars, fallback).answer
