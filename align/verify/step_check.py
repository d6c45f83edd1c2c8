"""A rule-based step check for worked arithmetic: every `a op b = c` a completion writes must be true.

The outcome verifier (align.eval.verifier) reads only the final answer, so a worked solution whose steps are wrong
but whose box happens to hold the gold number ("6 * 4 = 30. 30 + 7 = 31." for gold 31) earns full reward, and
reinforcing it teaches the false step. On the bundled task, a quarter of a small policy's correct samples were
such lucky ones (docs/MEASUREMENTS.md, rl). `false_steps` counts the equations that do not hold; the reward may
withhold the outcome from a completion that has any (align.rl.rewards, `step_check`).

Read: binary equations of decimal numbers, `a op b = c` with op one of + - * x × / (÷), each matched once, left to
right; a chain `a + b = c + d = e` is read as its first equation. Anything else is ignored (not counted false)."""

from __future__ import annotations

import re
from fractions import Fraction

NUMBER = r"(\d+(?:\.\d+)?)"
EQUATION = re.compile(NUMBER + r"\s*([-+*x×/÷])\s*" + NUMBER + r"\s*=\s*" + NUMBER)


def evaluate(a: Fraction, op: str, b: Fraction) -> Fraction | None:
    """a op b (None: a division by zero); shared with align.rl.step_credit."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op in "*x×":
        return a * b
    return a / b if b != 0 else None  # "/" or "÷"; a division by zero is never true


def equations(text: str) -> list[tuple[str, str, str, str]]:
    return EQUATION.findall(text)


def false_steps(text: str) -> int:
    """How many of the readable equations in `text` are false."""
    wrong = 0
    for a, op, b, c in equations(text):
        value = evaluate(Fraction(a), op, Fraction(b))
        wrong += value is None or value != Fraction(c)
    return wrong
