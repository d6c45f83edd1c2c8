"""Why an answer could not be read, and the work budget that keeps one call bounded without signals."""

from __future__ import annotations


class Unreadable(Exception):
    """The text is not an answer this verifier can check (unsupported form, or over a bound)."""


class Unsupported(Unreadable):
    """Grammar or mathematics outside the verifier's scope (a matrix, `2^3^2`, an unknown command, ...)."""


class OverBudget(Unreadable):
    """A size or work bound was hit: too many steps, bits, terms, digits or nesting levels."""


class Budget:
    """Counts work units for one answer; every loop in the parser and evaluator pays into it.

    NOTE: this (not a timer) is what bounds a call: cost is counted in steps, so a hostile answer is refused after
    the same amount of work whether it runs in the main thread, a worker thread or a process pool.
    """

    __slots__ = ("steps_left", "max_bits", "max_terms", "max_radicand", "max_digits")

    def __init__(self, max_steps: int, max_bits: int, max_terms: int, max_radicand: int, max_digits: int) -> None:
        self.steps_left = max_steps
        self.max_bits = max_bits
        self.max_terms = max_terms
        self.max_radicand = max_radicand
        self.max_digits = max_digits

    def spend(self, n: int = 1) -> None:
        self.steps_left -= n
        if self.steps_left < 0:
            raise OverBudget("step budget spent")

    def check_int(self, value: int) -> None:
        if value.bit_length() > self.max_bits:
            raise OverBudget(f"number over {self.max_bits} bits")

    def check_terms(self, count: int) -> None:
        if count > self.max_terms:
            raise OverBudget(f"expression over {self.max_terms} terms")
