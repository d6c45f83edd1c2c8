"""The bundled math task: templated arithmetic word problems with short worked solutions ending in `\\boxed{N}`.

A tiny Mistral-architecture model trained from scratch on two CPU cores for a few minutes must learn this task
partly: well above zero after SFT, far from saturated, so that DPO and GRPO have room to raise it. The difficulty
levels are the knob (calibration numbers: data/README.md):

- level 1: one step, 1-20 plus or minus 1-9 ("Mia has 7 apples. She finds 5 more. ...").
- level 2: one step, 10-49 plus or minus 1-9, or a product 2-9 x 2-5 ("4 bags with 5 pens in each").
- level 3: two steps: a product 2-5 x 2-5 or 2-20 plus or minus 1-9, then a gain or a loss of 1-9.
- level 4: three steps with larger numbers: a product 2-9 x 2-5 or 10-99 plus or minus 1-9 (carries and borrows
  across the tens), then two gains or losses of 1-9. Its accuracy after SFT is far from saturated: the share of the
  task that RL can still raise.

A problem's `key` is its arithmetic content (operations and operands, not its wording); the held-out eval split is
disjoint from every training split by key, so no eval problem appears in training even reworded.

Everything here is pure and seeded: the same `random.Random` state draws the same problems on every platform
(CPython's Mersenne Twister and `randrange` are stable across versions)."""

from __future__ import annotations

import random
from dataclasses import dataclass

NAMES = (("Mia", "She"), ("Tom", "He"), ("Ana", "She"), ("Ben", "He"), ("Lea", "She"), ("Sam", "He"),
         ("Ivy", "She"), ("Max", "He"), ("Zoe", "She"), ("Leo", "He"), ("Eva", "She"), ("Dan", "He"),
         ("Amy", "She"), ("Joe", "He"), ("Kim", "She"), ("Ray", "He"))
ITEMS = ("apples", "pens", "books", "coins", "shells", "cards", "stamps", "marbles", "cookies", "stickers",
         "beads", "eggs", "flowers", "rocks", "toys", "candies")
CONTAINERS = ("bags", "boxes", "jars", "baskets", "packs", "cups")
GAINS = ("buys {n} more", "finds {n} more", "gets {n} more from {friend}", "picks up {n} more")
LOSSES = ("gives {n} to {friend}", "loses {n}", "sells {n}", "gives away {n}")
SYMBOL = {"add": "+", "sub": "-", "mul": "*"}
WRONG_KINDS = ("slip", "wrong_op", "final_copy")


@dataclass(frozen=True)
class Step:
    """One arithmetic step `a op b = result` of a worked solution."""

    a: int
    op: str  # "add" | "sub" | "mul"
    b: int

    @property
    def result(self) -> int:
        return {"add": self.a + self.b, "sub": self.a - self.b, "mul": self.a * self.b}[self.op]


@dataclass(frozen=True)
class Problem:
    """A word problem: its arithmetic (`steps`), its wording (`question`) and its identity (`key`)."""

    level: int
    steps: tuple[Step, ...]
    question: str

    @property
    def answer(self) -> int:
        return self.steps[-1].result

    @property
    def key(self) -> str:
        """Arithmetic identity, independent of names and objects: `L3:mul:4,6|sub:5`."""
        parts = [f"{self.steps[0].op}:{self.steps[0].a},{self.steps[0].b}"]
        parts += [f"{s.op}:{s.b}" for s in self.steps[1:]]
        return f"L{self.level}:" + "|".join(parts)


# ---------------------------------------------------------------------------------------------------- arithmetic

def _draw_level1(rng: random.Random) -> tuple[Step, ...]:
    if rng.random() < 0.5:
        return (Step(rng.randint(1, 20), "add", rng.randint(1, 9)),)
    b = rng.randint(1, 9)
    return (Step(rng.randint(b + 1, 20), "sub", b),)


def _draw_level2(rng: random.Random) -> tuple[Step, ...]:
    kind = rng.random()
    if kind < 0.35:
        return (Step(rng.randint(10, 49), "add", rng.randint(1, 9)),)
    if kind < 0.7:
        b = rng.randint(1, 9)
        return (Step(rng.randint(max(10, b + 1), 49), "sub", b),)
    return (Step(rng.randint(2, 9), "mul", rng.randint(2, 5)),)


def _draw_level3(rng: random.Random) -> tuple[Step, ...]:
    if rng.random() < 0.3:
        first = Step(rng.randint(2, 5), "mul", rng.randint(2, 5))
    else:
        first = Step(rng.randint(2, 20), rng.choice(("add", "sub")), rng.randint(1, 9))
        if first.op == "sub" and first.b >= first.a:
            first = Step(first.a, "add", first.b)
    mid = first.result
    if rng.random() < 0.5 or mid < 2:
        return first, Step(mid, "add", rng.randint(1, 9))
    return first, Step(mid, "sub", rng.randint(1, min(9, mid - 1)))


def _gain_or_loss(rng: random.Random, amount: int) -> Step:
    """A gain, or a loss that leaves at least one object (answers stay positive)."""
    if rng.random() < 0.5 or amount < 2:
        return Step(amount, "add", rng.randint(1, 9))
    return Step(amount, "sub", rng.randint(1, min(9, amount - 1)))


def _draw_level4(rng: random.Random) -> tuple[Step, ...]:
    if rng.random() < 0.4:
        first = Step(rng.randint(2, 9), "mul", rng.randint(2, 5))
    else:
        b = rng.randint(1, 9)
        first = Step(rng.randint(10, 99), "add", b) if rng.random() < 0.5 else Step(rng.randint(10, 99), "sub", b)
    second = _gain_or_loss(rng, first.result)
    return first, second, _gain_or_loss(rng, second.result)


DRAW = {1: _draw_level1, 2: _draw_level2, 3: _draw_level3, 4: _draw_level4}
LEVELS = tuple(DRAW)


# ---------------------------------------------------------------------------------------------------- wording

def _event(rng: random.Random, step: Step, friend: str) -> str:
    templates = GAINS if step.op == "add" else LOSSES
    return rng.choice(templates).format(n=step.b, friend=friend)


def word_problem(rng: random.Random, level: int, steps: tuple[Step, ...]) -> Problem:
    """Dress `steps` in a story: a person, their objects, and one event per step after the first quantity."""
    (name, pron), item = rng.choice(NAMES), rng.choice(ITEMS)
    friend = rng.choice([n for n, _ in NAMES if n != name])
    first = steps[0]
    if first.op == "mul":
        sentences = [f"{name} has {first.a} {rng.choice(CONTAINERS)} with {first.b} {item} in each."]
        events = steps[1:]
    else:
        sentences = [f"{name} has {first.a} {item}."]
        events = steps
    for i, step in enumerate(events):
        lead = pron if i == 0 else f"Then {pron.lower()}"
        sentences.append(f"{lead} {_event(rng, step, friend)}.")
    sentences.append(f"How many {item} does {name} have now?")
    return Problem(level=level, steps=steps, question=" ".join(sentences))


def draw_problem(rng: random.Random, level: int) -> Problem:
    return word_problem(rng, level, DRAW[level](rng))


# ---------------------------------------------------------------------------------------------------- solutions

def render_solution(steps: tuple[Step, ...], results: tuple[int, ...] | None = None,
                    final: int | None = None) -> str:
    """Worked solution: one line per step, then `The answer is \\boxed{N}.`

    `results` and `final` override the true values: that is how a plausible wrong solution is written."""
    results = results or tuple(s.result for s in steps)
    lines, carry = [], steps[0].a
    for step, result in zip(steps, results):
        lines.append(f"{carry} {SYMBOL[step.op]} {step.b} = {result}.")
        carry = result
    final = results[-1] if final is None else final
    lines.append(f"The answer is \\boxed{{{final}}}.")
    return "\n".join(lines)


def _recompute(steps: tuple[Step, ...], at: int, first_result: int, op: str | None = None) -> tuple[int, ...]:
    """Results when step `at` yields `first_result` (optionally under another op) and later steps follow it."""
    out = [s.result for s in steps[:at]] + [first_result]
    for step in steps[at + 1:]:
        out.append(Step(out[-1], step.op, step.b).result)
    return tuple(out)


def wrong_solution(rng: random.Random, problem: Problem, kind: str) -> str | None:
    """A plausible wrong worked solution, or None when this kind cannot produce one here.

    - slip: one step's result is off by 1, 2 or 10 (a carry slip); later steps build on the wrong value.
    - wrong_op: one step uses the opposite operation (+ for -, - for +, + for *), computed correctly.
    - final_copy: every step is right, but the boxed answer is an operand or off by one."""
    steps = problem.steps
    at = rng.randrange(len(steps))
    step = steps[at]
    if kind == "slip":
        results = _recompute(steps, at, step.result + rng.choice((-10, -2, -1, 1, 2, 10)))
        final = None
    elif kind == "wrong_op":
        swapped = {"add": "sub", "sub": "add", "mul": "add"}[step.op]
        start = steps[at - 1].result if at else step.a
        results = _recompute(steps, at, Step(start, swapped, step.b).result)
        steps = steps[:at] + (Step(step.a, swapped, step.b),) + steps[at + 1:]
        final = None
    elif kind == "final_copy":
        results = tuple(s.result for s in steps)
        final = rng.choice((problem.answer + 1, problem.answer - 1, step.b))
    else:
        raise ValueError(f"unknown wrong-solution kind {kind!r}; expected one of {WRONG_KINDS}")
    answer = results[-1] if final is None else final
    if answer == problem.answer or min(*results, answer) < 0:
        return None
    return render_solution(steps, results, final)
