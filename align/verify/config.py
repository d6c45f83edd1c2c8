"""The verifier's one typed config, and the bounds that make a call cheap on hostile text.

Every limit here exists because the text being checked is written by the policy being trained: it will, sooner or
later, contain whatever makes a verifier slow, crash or say yes. The bounds are counts (characters, tokens, steps,
bits), never wall-clock time, so a call costs the same in a thread, a worker process or the main thread and no
signal handler is needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class VerifyConfig:
    """Extraction, parsing and comparison settings (TOML table `[verify]`)."""

    # Responses longer than this keep only their LAST this-many characters: the final answer is at the end, and a
    # response past the generation limit is cut anyway.
    max_response_chars: int = 32_768
    # An extracted answer (box content) longer than this is unreadable: a real final answer is short.
    max_answer_chars: int = 1_000
    # Bracket nesting deeper than this is unreadable; it bounds the parser's recursion (10,000 nested braces must
    # give an answer, not a RecursionError).
    max_depth: int = 40
    # Parser/evaluator work units per answer (tokens consumed, terms multiplied); past it the answer is unreadable.
    max_steps: int = 4_000
    # Work units for comparing two read answers (element pairs of two sets, cross-multiplications).
    max_compare_steps: int = 40_000
    # Largest numerator/denominator (in bits) any intermediate value may have: `10^{10^{10}}` is refused at once.
    max_bits: int = 8_192
    # Digits in one numeric literal (Python refuses int() of > 4,300 digits; giant literals are refused first).
    max_digits: int = 1_000
    # Terms in one polynomial: bounds the cost of (a+b+c+...)^n expansions.
    max_terms: int = 128
    # Largest radicand we factor to pull squares out of a square root (trial division to its cube root).
    max_radicand: int = 10**12
    # Look for "The answer is X" / "#### X" when there is no box. Off for RL rewards: an unboxed answer is
    # "unreadable" there, which is what teaches the format.
    fallback: bool = False
    # How "25%" compares with a plain number: "either" accepts 25 and 0.25, "fraction" only 0.25, "number" only 25.
    percent: Literal["either", "fraction", "number"] = "either"
    # A gold written as a decimal with at least this many significant digits, compared with a prediction whose exact
    # value has no finite decimal expansion of that length (1/3, sqrt 2, pi), matches when the prediction rounds to
    # it at the gold's number of places: the gold was clearly rounded. 0 turns the tolerance off.
    rounded_gold_min_sig_digits: int = 3
    # The numeric-vs-exact tolerance, the other way round: a gold whose exact value has no finite decimal expansion
    # (1/3, sqrt 10, pi) accepts a decimal prediction with at least this many significant digits that is the gold
    # rounded or truncated at the prediction's decimal places (`0.3333`, `0.6667`, `3.14159`), or the gold as a
    # double prints it (within 2^-52 relative: `3.1622776601683795`). A terminating gold (1/8) needs its exact value.
    # 0 turns it off: the RL reward does (align.verify.config.REWARD_CONFIG), so a policy is never paid for giving
    # up on the exact form. math_verify's counterpart is its 6-place float rounding.
    decimal_min_sig_digits: int = 4
    # A comma list (`10, 4, -2`, adjacent boxes) is ordered unless the gold is a set (`\{...\}`, `\pm`) or this says
    # the problem's answers are unordered ("list all solutions").
    unordered_lists: bool = False
    # An assignment to one variable equals its right-hand side: `y = 2x + 1` is `2x + 1`, `x = 5` is 5.
    assignment_is_value: bool = True
    # Units and currency around a number: "ignore" strips them (`5 \text{ cm}` is 5); "match" also requires the
    # gold's unit on the prediction (`5 m` is not `500 cm`: units are compared as written, never converted).
    units: Literal["ignore", "match"] = "ignore"

    def __post_init__(self) -> None:
        for name in ("max_response_chars", "max_answer_chars", "max_depth", "max_steps", "max_compare_steps",
                     "max_bits", "max_digits", "max_terms", "max_radicand"):
            if getattr(self, name) < 1:
                raise ValueError(f"VerifyConfig.{name} must be >= 1, got {getattr(self, name)!r}")
        if self.percent not in ("either", "fraction", "number"):
            raise ValueError(f"VerifyConfig.percent must be 'either', 'fraction' or 'number', got {self.percent!r}")
        if self.units not in ("ignore", "match"):
            raise ValueError(f"VerifyConfig.units must be 'ignore' or 'match', got {self.units!r}")
        for name in ("rounded_gold_min_sig_digits", "decimal_min_sig_digits"):
            if getattr(self, name) < 0:
                raise ValueError(f"VerifyConfig.{name} must be >= 0, got {getattr(self, name)!r}")


DEFAULT_CONFIG = VerifyConfig()
# The GRPO reward's and the golden evaluation's default (align/eval/verifier.py): exact golds need exact answers.
REWARD_CONFIG = VerifyConfig(decimal_min_sig_digits=0)
