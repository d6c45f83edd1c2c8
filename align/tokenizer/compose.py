"""Function composition shared by the tokenizer.json component builders (the "Sequence" of each kind)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def pipe(steps: list[Callable[[T], T]]) -> Callable[[T], T]:
    """Apply `steps` in order; one step is returned as is (no wrapper call on the hot path)."""
    if len(steps) == 1:
        return steps[0]

    def run(value: T) -> T:
        for step in steps:
            value = step(value)
        return value

    return run
