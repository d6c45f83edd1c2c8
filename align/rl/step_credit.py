"""Step credit: a per-token advantage on the result of every `a op b = c` a completion writes, from the same fact's
truth in the other samples of its group.

Why: on the bundled task almost every wrong greedy answer is one false arithmetic step ("2 + 5 = 6", "41 + 4 =
46"; docs/MEASUREMENTS.md, ladder, 2026-12-04), and the outcome reward says nothing about which step it was. Under
`negative_scale = 0` a wrong sample is dropped whole, with the true steps it wrote; a right one reinforces every
token alike. The step check (align.verify.step_check) can judge each equation exactly, so each one is a verifiable
bandit trial of one fact: the tokens of its result `c` get

    A_step = weight * (t - mu_f) / (sigma_f + eps)      t = 1 if a op b = c holds, else 0

where mu_f, sigma_f are the mean and population std of t over every occurrence of the same left side `a op b`
(fact f) in the group's G samples (group-relative, as GRPO's outcome advantage). A fact the whole group gets right,
or wrong, earns 0: no push where there is nothing to choose between. A negative A_step is multiplied by
`negative_scale` (0: reinforce true results only, as the outcome's `negative_scale`). The step advantage is added
to the outcome advantage on those tokens only; every other token keeps the sequence's advantage.

Tokens and characters: a completion's text is its tokens decoded (the batch source's `decode`); token k covers the
characters between the decodes of its prefixes k-1 and k. A result's tokens are those that overlap its digits. A
completion whose prefix decodes are not prefixes of its text (a byte-fallback split inside a character) gets no
step credit rather than a guessed alignment."""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Sequence

import torch

from align.verify.step_check import EQUATION, evaluate


@dataclass(frozen=True)
class StepCreditConfig:
    """[step_credit] table."""

    weight: float = 0.0  # 0: off (the outcome advantage alone)
    negative_scale: float = 0.0  # multiplies a false result's negative A_step (0: true results only)
    eps: float = 1e-4

    def __post_init__(self):
        if self.weight < 0:
            raise ValueError(f"StepCreditConfig.weight must be >= 0, got {self.weight}")
        if not 0.0 <= self.negative_scale <= 1.0:
            raise ValueError(f"StepCreditConfig.negative_scale must lie in [0, 1], got {self.negative_scale}")
        if self.eps < 0:
            raise ValueError(f"StepCreditConfig.eps must be >= 0, got {self.eps}")

    @property
    def enabled(self) -> bool:
        return self.weight > 0


@dataclass(frozen=True)
class Result:
    """One equation of a completion: its fact (the left side), whether it holds, its result's characters."""

    fact: tuple[str, str, str]
    true: bool
    start: int
    end: int


def results(text: str) -> list[Result]:
    """Every readable `a op b = c` of `text` (as align.verify.step_check reads them), left to right."""
    out = []
    for m in EQUATION.finditer(text):
        a, op, b, c = m.groups()
        value = evaluate(Fraction(a), op, Fraction(b))
        out.append(Result((a, op, b), value is not None and value == Fraction(c), m.start(4), m.end(4)))
    return out


def token_spans(ids: Sequence[int], decode: Callable[[list[int]], str],
                text: str | None = None) -> list[tuple[int, int]] | None:
    """(start, end) characters of each token in `text` = decode(ids) (pass it when already decoded); None when
    prefixes do not decode to prefixes."""
    text = decode(list(ids)) if text is None else text
    spans, prev = [], 0
    for k in range(1, len(ids) + 1):
        head = decode(list(ids[:k]))
        if not text.startswith(head) or len(head) < prev:
            return None
        spans.append((prev, len(head)))
        prev = len(head)
    return spans


def result_tokens(spans: Sequence[tuple[int, int]], result: Result) -> list[int]:
    return [k for k, (s, e) in enumerate(spans) if s < result.end and e > result.start]


def group_step_advantages(completions: Sequence[Sequence[int]], decode: Callable[[list[int]], str],
                          cfg: StepCreditConfig) -> list[list[float]]:
    """Per-token step advantages (one list per completion, its own length) of one prompt's G completions."""
    parsed = []
    for ids in completions:
        text = decode(list(ids))
        spans = token_spans(ids, decode, text)
        parsed.append((spans, results(text) if spans is not None else []))
    truths: dict[tuple[str, str, str], list[float]] = {}
    for _, found in parsed:
        for r in found:
            truths.setdefault(r.fact, []).append(float(r.true))
    out = []
    for ids, (spans, found) in zip(completions, parsed):
        adv = [0.0] * len(ids)
        for r in found:
            t = truths[r.fact]
            mu = sum(t) / len(t)
            sigma = math.sqrt(sum((x - mu) ** 2 for x in t) / len(t))
            a = cfg.weight * (float(r.true) - mu) / (sigma + cfg.eps)
            if a < 0:
                a *= cfg.negative_scale
            for k in result_tokens(spans, r):
                adv[k] += a
        out.append(adv)
    return out


def step_advantages(groups: Sequence[Sequence[Sequence[int]]], decode: Callable[[list[int]], str],
                    cfg: StepCreditConfig, width: int) -> torch.Tensor:
    """(N, width) float32 step advantages of every completion of `groups` (group order, then sample order: the
    layout of align.rl.assembly.assemble), right-padded with 0."""
    rows = [adv for group in groups for adv in group_step_advantages(group, decode, cfg)]
    out = torch.zeros(len(rows), width, dtype=torch.float32)
    for i, adv in enumerate(rows):
        if adv:
            out[i, :len(adv)] = torch.tensor(adv, dtype=torch.float32)
    return out
