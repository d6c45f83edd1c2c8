"""One answer string -> one Value: clean, tokenise, parse, with every bound of VerifyConfig applied.

Results are memoised (a GRPO group scores many responses against one gold, and short answers repeat); Values are
never mutated after construction, so sharing them is safe.
"""

from __future__ import annotations

import re
from fractions import Fraction
from functools import lru_cache

from align.verify import algebra as A
from align.verify.config import VerifyConfig
from align.verify.expr import REALS, Parser, as_scalar
from align.verify.extract import final_group, find_boxes, join_group
from align.verify.lexer import END, tokenize
from align.verify.limits import Budget, OverBudget, Unreadable, Unsupported
from align.verify.normalize import APPROX, clean
from align.verify.algebra import Scalar
from align.verify.structures import is_label
from align.verify.values import Degrees, Percent, Relation, Text, Value

_PLAIN_NUMBER = re.compile(r"-?[0-9]{1,40}(?:\.[0-9]{1,40})?")
_WORDS = re.compile(r"[a-zA-Z][a-zA-Z ]*")
_TEXT_ONLY = re.compile(r"\\text\{([^{}]*)\}")
_LONG_WORD = re.compile(r"[a-zA-Z]{3,}")
_ALL_REALS = frozenset({"all real numbers", "all reals", "all real x", "real numbers", "all real values"})


def make_budget(cfg: VerifyConfig, compare: bool = False) -> Budget:
    """The work budget for reading one answer, or (compare=True) for comparing two read answers."""
    steps = cfg.max_compare_steps if compare else cfg.max_steps
    return Budget(steps, cfg.max_bits, cfg.max_terms, cfg.max_radicand, cfg.max_digits)


def unbox(text: str) -> str:
    """An answer given with its box (`\\boxed{5}`) is its box's content; adjacent boxes form a set."""
    if "box" not in text:
        return text
    boxes = find_boxes(text)
    if not boxes:
        return text
    return join_group([b.content or "" for b in final_group(text, boxes)])


def _word_answer(words: str) -> Value:
    text = " ".join(words.lower().split())
    return REALS if text in _ALL_REALS else Text(text)


def _approximation(s: str, cfg: VerifyConfig) -> Value:
    """`x = 1/4 \\approx 0.25`: the exact part, when the approximation agrees with it to its last written place
    (`\\frac92 \\approx 4.7` is refused: the answer contradicts itself); `x \\approx 0.33`: the approximation."""
    exact_text, _, approx_text = s.partition(APPROX)
    exact = _parse(exact_text.strip(), cfg) if exact_text.strip() else None
    approx = _parse(approx_text.split(APPROX)[-1].strip(), cfg)
    if isinstance(exact, Relation) and exact.op == "=" and is_label(exact.lhs):
        exact = exact.rhs
    if exact is None or (isinstance(exact, Scalar) and is_label(exact)):
        return approx
    if not (isinstance(exact, Scalar) and isinstance(approx, Scalar)):
        raise Unsupported("approximation of a non-number")
    e, a = exact.approx(), approx.approx()
    places = len(approx.lit.partition(".")[2]) if approx.lit else 0
    if e is None or a is None or abs(e - a) > 10.0 ** -places * (1 + 1e-9):
        raise Unsupported("the approximation disagrees with the exact value")
    return exact


def _parse(s: str, cfg: VerifyConfig) -> Value:
    if APPROX in s:
        return _approximation(s, cfg)
    if _PLAIN_NUMBER.fullmatch(s):  # fast path: most gold and predicted answers are plain numbers
        q = Fraction(s)
        return A.Scalar({A.ONE_MONO: q} if q else {}, None, s if "." in s else None)
    text_only = _TEXT_ONLY.fullmatch(s)
    if text_only:
        return _word_answer(text_only.group(1))
    if _WORDS.fullmatch(s) and _LONG_WORD.search(s):
        return _word_answer(s)
    budget = make_budget(cfg)
    tokens = tokenize(s, budget)
    mark = tokens[-2].text if len(tokens) >= 2 and tokens[-2].kind == "op" else ""
    if mark in ("%", "\u00b0"):  # a final `%` or degree sign says what the whole answer is
        tokens = tokens[:-2] + [END]
    value = Parser(tokens, budget, cfg.max_depth).parse()
    if mark == "%":
        return Percent(as_scalar(value))
    return Degrees(as_scalar(value)) if mark == "\u00b0" and isinstance(value, Scalar) else value


@lru_cache(maxsize=16_384)
def _read_cached(text: str, cfg: VerifyConfig) -> tuple[Value | None, type[Unreadable], str]:
    try:
        s = clean(unbox(text))
        if not s:
            raise Unreadable("empty answer")
        return _parse(s, cfg), Unreadable, ""
    except Unreadable as e:
        return None, type(e), str(e)
    except RecursionError:  # NOTE: only reachable if the caller's own stack is already deep; depth is capped.
        return None, OverBudget, "recursion"
    except (ArithmeticError, ValueError) as e:  # e.g. a float overflow in a bound check: unreadable, not a crash
        return None, Unreadable, f"{type(e).__name__}: {e}"


def read_answer(text: str, cfg: VerifyConfig) -> Value:
    """The Value of one answer string; raises Unreadable (OverBudget, Unsupported) saying why it cannot be checked."""
    if len(text) > cfg.max_answer_chars:  # checked before the memo, which must never hold a huge key
        raise OverBudget(f"answer over {cfg.max_answer_chars} characters")
    value, kind, why = _read_cached(text, cfg)
    if value is None:
        raise kind(why)
    return value
