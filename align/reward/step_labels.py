"""Step-labelled records (align.data.schema.StepLabelled, what align.reward.rm_process trains a PRM on) derived from
worked solutions of the bundled arithmetic task, labelled by rule instead of by people.

The bundled task writes one step per line ("12 + 7 = 19.", then "The answer is \\boxed{19}.", align.data.mathtask),
which is rm_process's encoding of a solution (its steps joined by newlines). A line is rated
    -1  when it writes an `a op b = c` that is false (align.verify.step_check), or a box whose answer is not the gold
        (align.eval.verifier);
    +1  when every equation it writes is true, or its box holds the gold;
     0  otherwise (no equation, no box: nothing to check; rm_process's `neutral` decides what that means).
What the rule cannot see: a true equation on a wrong operand ("wrong_op": the right arithmetic on the wrong
operation) is +1, and so is every true step after a false one (they build on a wrong carry but are true as written);
the wrong final box still gets its -1. Sources: a preference pair's chosen and rejected solutions (the scripted and
on-policy pairs, `step_records`), or any completion with its gold."""

from __future__ import annotations

from typing import Iterable

from align.data.schema import PreferencePair, StepLabelled
from align.eval.verifier import score
from align.verify.step_check import equations, false_steps
from align.verify import DEFAULT_CONFIG, extract


def rate_step(line: str, gold: str) -> int:
    """-1 / 0 / +1 for one solution line (module doc)."""
    if "\\boxed" in line:
        verdict = score(line, gold).reward
        return 1 if verdict == 1.0 else -1
    if not equations(line):
        return 0
    return -1 if false_steps(line) else 1


def label_solution(record_id: str, prompt, solution: str, gold: str, group: str = "") -> StepLabelled | None:
    """The solution's non-empty lines as steps with their rule ratings; None when it has no line."""
    steps = tuple(line.strip() for line in solution.strip().split("\n") if line.strip())
    if not steps:
        return None
    return StepLabelled(record_id, tuple(prompt), steps, tuple(rate_step(s, gold) for s in steps), gold, group)


def chosen_answer(pair: PreferencePair) -> str:
    """The bundled task's pairs carry no gold: their chosen solution is a correct one, so its box is the gold."""
    found = extract(pair.chosen, DEFAULT_CONFIG.max_response_chars, DEFAULT_CONFIG.fallback).answer
    if found is None:
        raise ValueError(f"pair {pair.id!r}: its chosen solution has no readable box to take the gold from")
    return found


def step_records(pairs: Iterable[PreferencePair], gold_of=chosen_answer) -> list[StepLabelled]:
    """Both solutions of every pair as step-labelled records (`<id>/chosen`, `<id>/rejected`), the pair's group
    kept (so a split by group keeps a problem's two solutions together). `gold_of(pair)`: the pair's gold answer."""
    out = []
    for pair in pairs:
        gold = gold_of(pair)
        for side in ("chosen", "rejected"):
            record = label_solution(f"{pair.id}/{side}", pair.prompt, getattr(pair, side), gold, pair.group)
            if record is not None:
                out.append(record)
    return out
