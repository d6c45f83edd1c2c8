"""The outcome verdict of a rung: its held-out greedy accuracy against the band recorded for the profile.

The golden check (align.eval.golden) asks whether the decode is bit for bit a recorded one. A host whose training
lands on other weights (another ISA, another BLAS) can only read `checkpoint_changed` there, which says nothing
about whether the rung learned. The outcome verdict says that: `[outcome.<rung>]` in the profile's
golden_eval.toml records the range of held-out accuracy the rung reached on measured runs (several seeds and ISAs,
named by `source`), optionally per level (the eval set's group column), and the receipt reads

    expected     the accuracy, and every level that has a band, inside its band (bounds included)
    regression   the accuracy or a level with a band below it (a level below wins: a loss hidden in the total counts)
    improvement  the accuracy or a level above its band, and nothing below
    unrecorded   no band for this rung

A level with a band but absent from the evaluation reads `not_evaluated` in the detail and decides nothing.

    [outcome.grpo]
    accuracy = [0.90, 0.93]
    source = "3 seeds x 2 ISAs (AVX-512, AVX2), commit abc1234"
    groups = { "1" = [0.97, 1.0], "4" = [0.70, 0.80] }"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

EXPECTED, REGRESSION, IMPROVEMENT, UNRECORDED = "expected", "regression", "improvement", "unrecorded"
NOT_EVALUATED = "not_evaluated"  # a level's detail only
_RELATION = {EXPECTED: "within", REGRESSION: "below", IMPROVEMENT: "above"}


def check_band(key: str, band: tuple[float, ...]) -> None:
    """A band is [lo, hi] with 0 <= lo <= hi <= 1; a ValueError naming `key` otherwise."""
    if len(band) != 2 or not all(math.isfinite(v) for v in band) or not 0.0 <= band[0] <= band[1] <= 1.0:
        raise ValueError(f"{key} = {list(band)}: expected [lo, hi] with 0 <= lo <= hi <= 1")


@dataclass(frozen=True)
class OutcomeBand:
    """[outcome.<rung>] table: where the rung's held-out greedy accuracy lands on the measured runs."""

    accuracy: tuple[float, ...]  # [lo, hi] of the overall accuracy
    source: str  # which runs the band comes from (seeds x ISAs, commit): a band without it cannot be checked
    groups: dict[str, tuple[float, ...]] = field(default_factory=dict)  # level -> [lo, hi]

    def __post_init__(self):
        check_band("accuracy", self.accuracy)
        for group, band in self.groups.items():
            check_band(f"groups.{group}", band)
        if not self.source.strip():
            raise ValueError("source is empty: name the runs the band comes from (seeds x ISAs, commit)")


def check_rungs(outcome: dict[str, OutcomeBand], rungs: list[str]) -> None:
    """Every [outcome.<rung>] names a rung of [checkpoints]; a ValueError naming the key otherwise."""
    for rung in outcome:
        if rung not in rungs:
            raise ValueError(f"outcome.{rung}: {rung!r} is not a key of [checkpoints] "
                             f"(known: {', '.join(rungs) or 'none'})")


def _place(value: float | None, band: tuple[float, ...]) -> str:
    if value is None or not math.isfinite(value) or value < band[0]:  # nothing measured is below any band
        return REGRESSION
    return IMPROVEMENT if value > band[1] else EXPECTED


def verdict(band: OutcomeBand | None, accuracy: float | None, by_group: dict[str, float]) -> dict:
    """The receipt's `outcome` section for one rung: verdict, accuracy, band, source, per-level detail."""
    if band is None:
        return {"verdict": UNRECORDED, "accuracy": accuracy, "band": None, "source": None, "groups": {}}
    groups = {}
    for group, gband in band.groups.items():
        value = by_group.get(group)
        groups[group] = {"accuracy": value, "band": list(gband),
                         "verdict": NOT_EVALUATED if value is None else _place(value, gband)}
    places = [_place(accuracy, band.accuracy), *(g["verdict"] for g in groups.values())]
    overall = next((v for v in (REGRESSION, IMPROVEMENT) if v in places), EXPECTED)
    return {"verdict": overall, "accuracy": accuracy, "band": list(band.accuracy), "source": band.source,
            "groups": groups}


def _num(value: float | None) -> str:
    return "none" if value is None else f"{value:.3f}"


def _range(band: list[float]) -> str:
    return f"{band[0]:.3f}-{band[1]:.3f}"


def describe(outcome: dict, rung: str) -> str:
    """One line with the numbers, e.g. `outcome: regression: accuracy 0.812 below the recorded band 0.900-0.930
    (3 seeds x 2 ISAs, abc1234)`; the levels outside their bands follow the total."""
    head = f"outcome: {outcome['verdict']}: accuracy {_num(outcome['accuracy'])}"
    if outcome["verdict"] == UNRECORDED:
        return f"{head}; no recorded band for {rung} ([outcome.{rung}] in golden_eval.toml)"
    place = _place(outcome["accuracy"], outcome["band"])
    parts = [f"{head} {_RELATION[place]} the recorded band {_range(outcome['band'])}"]
    for group, g in outcome["groups"].items():
        if g["verdict"] == NOT_EVALUATED:
            parts.append(f"level {group} not evaluated")
        elif g["verdict"] != EXPECTED:
            parts.append(f"level {group} {_num(g['accuracy'])} {_RELATION[g['verdict']]} {_range(g['band'])}")
    return ", ".join(parts) + f" ({outcome['source']})"
