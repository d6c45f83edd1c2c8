"""MATH-style gold answers of every form are readable: a seeded generated set, each gold compared with itself, with a
re-spelling of the same answer (must be equal) and with a perturbed answer (must not be)."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest

from align.verify import are_equivalent, why_unreadable


def _frac(q: Fraction) -> str:
    sign = "-" if q < 0 else ""
    return f"{sign}\\frac{{{abs(q.numerator)}}}{{{q.denominator}}}" if q.denominator != 1 else str(q.numerator)


def _fraction(rng):
    q = Fraction(rng.randint(1, 60), rng.randint(2, 30)) * rng.choice((1, -1))
    if q.denominator == 1:
        q += Fraction(1, 7)
    k = rng.randint(2, 6)
    p, d = q.numerator, q.denominator
    return _frac(q), f"\\dfrac{{{k * p}}}{{{k * d}}}", _frac(q + 1)


def _radical(rng):
    a, b = rng.randint(2, 9), rng.choice((2, 3, 5, 6, 7, 10))
    return f"{a}\\sqrt{{{b}}}", f"\\sqrt{{{a * a * b}}}", f"{a + 1}\\sqrt{{{b}}}"


def _pi(rng):
    k, n = rng.randint(1, 11), rng.randint(2, 12)
    return f"\\frac{{{k}\\pi}}{{{n}}}", f"\\frac{{{k}}}{{{n}}}\\pi", f"\\frac{{{k}\\pi}}{{{n + 1}}}"


def _matrix(rng):
    a = [[rng.randint(-9, 9) for _ in range(2)] for _ in range(2)]
    env = "\\begin{pmatrix} %s \\end{pmatrix}"
    gold = env % " \\\\ ".join(" & ".join(map(str, r)) for r in a)
    other = "\\begin{bmatrix} %s \\end{bmatrix}" % " \\\\ ".join(" & ".join(f"\\frac{{{2 * x}}}{{2}}" for x in r)
                                                                for r in a)
    wrong = env % " \\\\ ".join(" & ".join(map(str, r)) for r in (a[1], a[0]))
    if a[0] == a[1]:
        wrong = env % f"{a[0][0] + 1} & {a[0][1]} \\\\ {a[1][0]} & {a[1][1]}"
    return gold, other, wrong


def _vector(rng):
    xs = [rng.randint(-9, 9) for _ in range(3)]
    gold = "\\begin{pmatrix} %s \\end{pmatrix}" % " \\\\ ".join(map(str, xs))
    return gold, "(" + ", ".join(map(str, xs)) + ")", "(" + ", ".join(map(str, xs[:2] + [xs[2] + 1])) + ")"


def _base(rng):
    b = rng.randint(2, 9)
    n = rng.randint(b, 2000)
    digits = ""
    m = n
    while m:
        digits, m = str(m % b) + digits, m // b
    wrong_digits = digits[:-1] + str((int(digits[-1]) + 1) % b)
    return f"{digits}_{b}", f"{digits}_{{{b}}}", f"{wrong_digits}_{b}"


def _interval(rng):
    a, b = sorted(rng.sample(range(-30, 30), 2))
    lo, hi = rng.choice("(["), rng.choice(")]")
    ops = {"(": "<", "[": "\\le", ")": "<", "]": "\\le"}
    wrong = ("[" if lo == "(" else "(") + f"{a}, {b}" + hi
    return f"{lo}{a}, {b}{hi}", f"{a} {ops[lo]} x {ops[hi]} {b}", wrong


def _union(rng):
    a, b, c, d = sorted(rng.sample(range(-30, 30), 4))
    return (f"[{a}, {b}) \\cup ({c}, {d}]", f"({c}, {d}] \\cup [{a}, {b})", f"[{a}, {b}] \\cup ({c}, {d}]")


def _ray(rng):
    a = rng.randint(-20, 20)
    return f"(-\\infty, {a}]", f"x \\le {a}", f"x < {a}"


def _set(rng):
    xs = rng.sample(range(-20, 20), 3)
    shuffled = rng.sample(xs, 3)
    return "\\{" + ", ".join(map(str, xs)) + "\\}", ", ".join(map(str, shuffled)), ", ".join(map(str, xs[:2]))


def _pair(rng):
    a, b = rng.sample(range(-20, 20), 2)
    return f"({a}, {b})", f"\\left( {a}, {b} \\right)", f"({b}, {a})"


def _text(rng):
    word = rng.choice(("Evelyn", "odd", "Tuesday", "(C)", "yes", "neither", "Bob"))
    other = rng.choice(("\\textbf{%s}", "\\mbox{%s}", "\\text{ %s }"))
    wrong = {"Evelyn": "Emily", "odd": "even", "Tuesday": "Monday", "(C)": "(D)", "yes": "no", "neither": "both",
             "Bob": "Alice"}[word]
    return f"\\text{{{word}}}", other % word, f"\\text{{{wrong}}}"


def _degrees(rng):
    k = rng.choice((15, 30, 45, 60, 90, 120, 135, 150))
    return f"{k}^\\circ", f"{k}^{{\\circ}}", f"{k + 5}^\\circ"


def _percent(rng):
    k = rng.randint(1, 99)
    return f"{k}\\%", f"{k} percent", f"{k + 1}\\%"


def _dollars(rng):
    k = rng.randint(1, 99_999)
    return f"\\${k:,}", f"{k} dollars", f"\\${k + 1}"


def _mixed(rng):
    a, c = rng.randint(1, 20), rng.randint(2, 9)
    b = rng.randint(1, c - 1)
    return f"{a}\\frac{{{b}}}{{{c}}}", _frac(Fraction(a * c + b, c)), _frac(Fraction(a * b, c))


def _plus_minus(rng):
    a, b = rng.randint(1, 9), rng.choice((2, 3, 5, 7))
    return f"{a} \\pm \\sqrt{{{b}}}", f"{a} - \\sqrt{b}, {a} + \\sqrt{b}", f"{a} + \\sqrt{b}"


def _equation(rng):
    m, c = rng.randint(2, 9), rng.randint(1, 9)
    return f"y = {m}x + {c}", f"y = {c} + {m}x", f"y = {m}x - {c}"


def _thousands(rng):
    n = rng.randint(1000, 9_999_999)
    return f"{n:,}", f"{n:,}".replace(",", "{,}"), f"{n + 10:,}"


MAKERS = [_fraction, _radical, _pi, _matrix, _vector, _base, _interval, _union, _ray, _set, _pair, _text, _degrees,
          _percent, _dollars, _mixed, _plus_minus, _equation, _thousands]
GENERATED = [(maker.__name__[1:], *maker(random.Random(seed))) for maker in MAKERS for seed in range(12)]


@pytest.mark.parametrize("form, gold, respelled, wrong", GENERATED)
def test_math_gold_form(form, gold, respelled, wrong):
    assert why_unreadable(gold) is None, (form, gold)
    assert are_equivalent(gold, gold) is True, (form, gold)
    assert are_equivalent(gold, respelled) is True, (form, gold, respelled)
    assert are_equivalent(gold, wrong) is False, (form, gold, wrong)
