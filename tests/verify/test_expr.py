"""align.verify.expr and algebra: exact values, canonical forms, and the bounds that refuse hostile input."""

from __future__ import annotations

from fractions import Fraction

import pytest

from align.verify import VerifyConfig, read_answer
from align.verify.algebra import Scalar
from align.verify.answer import make_budget
from align.verify.config import DEFAULT_CONFIG
from align.verify.expr import Parser
from align.verify.lexer import tokenize
from align.verify.limits import OverBudget, Unreadable, Unsupported
from align.verify.values import FiniteSet, Interval, List, PairParen, Percent, Relation, Text, Tuple


def value(text: str, cfg: VerifyConfig = DEFAULT_CONFIG):
    return read_answer(text, cfg)


def rational(text: str) -> Fraction:
    v = value(text)
    assert isinstance(v, Scalar), v
    q = v.rational()
    assert q is not None, v
    return q


@pytest.mark.parametrize("text, expected", [
    ("0.1", Fraction(1, 10)), ("-0.75", Fraction(-3, 4)), ("1.5e3", 1500), ("1.5E-3", Fraction(3, 2000)),
    (r"\frac{3}{-4}", Fraction(-3, 4)), (r"\frac12", Fraction(1, 2)), (r"2\frac{1}{2}", Fraction(5, 2)),
    (r"-2\frac12", Fraction(-5, 2)), ("2 1/2", Fraction(5, 2)), ("2^10", 1024), ("-3^2", -9), ("(-3)^2", 9),
    ("10^-3", Fraction(1, 1000)), ("8/4/2", 1), ("2+3*4", 14), (r"\binom{5}{2}", 10), ("5!", 120), ("|-3|", 3),
    (r"\lfloor \pi \rfloor", 3), (r"\lceil 3.2 \rceil", 4), (r"\log_2 8", 3), (r"\log_4 8", Fraction(3, 2)),
    (r"\sqrt[3]{-8}", -2), ("8^{2/3}", 4), (r"\sin\frac{\pi}{6}", Fraction(1, 2)), (r"\tan\frac{3\pi}{4}", -1),
    (r"\cos(2\pi)", 1), ("x - x", 0), ("25%+1", Fraction(5, 4)),
    (r"2^2\frac{1}{2}", 2), (r"\log_2 \frac{1}{2}", -1), (r"\log_2 1/2", 0),  # no mixed numbers in ^ or args
    (r"3 \cdot 2\frac{1}{2}", Fraction(15, 2)),
])
def test_exact_rationals(text, expected):
    assert rational(text) == Fraction(expected)


@pytest.mark.parametrize("a, b", [
    (r"\sqrt{12}", r"2\sqrt{3}"), (r"\sqrt{2}\sqrt{3}", r"\sqrt{6}"), (r"\frac{1}{\sqrt{2}}", r"\frac{\sqrt2}{2}"),
    (r"\frac{1}{1+\sqrt{2}}", r"\sqrt{2}-1"), (r"\frac{1}{\sqrt{2}+\sqrt{3}}", r"\sqrt{3}-\sqrt{2}"),
    (r"\frac{\pi}{2}", r"0.5\pi"), (r"\pi^{-1}", r"\frac{1}{\pi}"), ("(x+1)^2", "x^2+2x+1"),
    (r"\frac{x^2-1}{x-1}", "x+1"), (r"\frac{1}{x}+\frac{1}{y}", r"\frac{x+y}{xy}"), (r"\sqrt[3]{2}", "2^{1/3}"),
    (r"\sin\frac{\pi}{12}", r"\frac{\sqrt6-\sqrt2}{4}"), (r"\exp(x)", "e^x"),
    (r"\cos\frac{\pi}{6}", r"\frac{\sqrt3}{2}"),
])
def test_equal_values_in_different_forms(a, b):
    from align.verify.algebra import equal
    va, vb = value(a), value(b)
    assert equal(va, vb, make_budget(DEFAULT_CONFIG)), (va, vb)


def test_structures():
    assert isinstance(value("(1,2)"), PairParen)
    assert isinstance(value("[1,2)"), Interval)
    assert isinstance(value("(1,2,3)"), Tuple)
    assert isinstance(value(r"\{1,2\}"), FiniteSet)
    assert isinstance(value("1, 2"), List)  # ordered unless the gold is a set
    assert isinstance(value(r"1 \pm \sqrt2"), FiniteSet) and len(value(r"1 \pm \sqrt2").items) == 2
    assert isinstance(value("25%"), Percent)
    assert isinstance(value(r"\text{Evelyn}"), Text)
    assert isinstance(value("y = 2x + 1"), Relation)
    iv = value(r"x \le 3")
    assert isinstance(iv, Interval) and iv.hi_closed and not iv.lo_closed
    assert isinstance(value("(2,3) \\cup (4,5)").parts[1], PairParen)


@pytest.mark.parametrize("text", [
    "2^3^2",  # a TeX double superscript
    "5 = 6", "x = 1 = 2",  # false statements are not their right-hand side
    r"\frac{1}{0}", "0^0", r"\infty - \infty", r"\sqrt[4]{-16}",
    r"\begin{pmatrix}1 & 2 \\ 3\end{pmatrix}", "1 00", "3.1.4",
    r"5 \text{ maybe}", "x'", r"\unknown{3}", "()", "(1,2]]", "[1]]",
])
def test_unsupported_forms_are_unreadable(text):
    with pytest.raises(Unreadable):
        value(text)


@pytest.mark.parametrize("text", [
    r"10^{10^{10}}", r"2^{2^{2^{2^{2}}}}", "1000000!", "1e999999999", r"\binom{10^9}{3}",
    "(x+1)^{1000}", r"(1+\sqrt2)^{500}", r"\sqrt{" + "7" * 40 + "1}", "9" * 2000,
])
def test_giant_values_are_refused_not_computed(text):
    with pytest.raises(OverBudget):
        value(text)


def test_nesting_is_bounded_without_recursion_error():
    cfg = VerifyConfig(max_answer_chars=100_000)
    for text in ("{" * 10_000 + "5" + "}" * 10_000, "(" * 10_000 + "5" + ")" * 10_000,
                 r"\frac{1}" * 5_000 + "{1}", r"\sqrt" * 10_000 + "{4}", "2^{" * 5000 + "2" + "}" * 5000):
        with pytest.raises(OverBudget):
            value(text, cfg)
    assert rational("(" * 30 + "5" + ")" * 30) == 5  # inside the bound, fine


def test_long_flat_inputs_are_iterative():
    cfg = VerifyConfig(max_answer_chars=100_000, max_steps=1_000_000)
    assert rational_cfg("-" * 10_000 + "1", cfg) == 1
    assert rational_cfg("+".join(["1"] * 5_000), cfg) == 5000


def rational_cfg(text: str, cfg: VerifyConfig) -> Fraction:
    return value(text, cfg).rational()


def test_step_budget_is_what_stops_work():
    tight = VerifyConfig(max_steps=50)
    with pytest.raises(OverBudget, match="step budget"):
        value("+".join(["1"] * 40), tight)
    assert value("+".join(["1"] * 10), tight).rational() == 10


def test_answer_length_bound_applies_before_the_memo():
    from align.verify.answer import _read_cached
    cfg = VerifyConfig(max_answer_chars=10)
    before = _read_cached.cache_info().currsize
    with pytest.raises(OverBudget):
        value("1" + " " * 50_000, cfg)
    assert _read_cached.cache_info().currsize == before


def test_parser_counts_depth_itself():
    budget = make_budget(DEFAULT_CONFIG)
    tokens = tokenize("((((1))))", budget)
    with pytest.raises(OverBudget):
        Parser(tokens, budget, max_depth=3).parse()
    with pytest.raises(Unsupported):
        Parser(tokenize("(1", budget), budget, max_depth=3).parse()
