"""A small generated raw-text corpus for the tiny pretraining rung: two sources of English prose about arithmetic.

- `stories`: short word-problem stories told to the end ("Mia has 12 shells. She finds 5 more, so she has
  12 + 5 = 17 shells."), 2-5 sentences, the register of the bundled math task (align.data.mathtask).
- `facts`: lists of arithmetic facts ("7 times 8 is 56. 56 is even."), a second source with its own statistics,
  so a weighted mixture has something to weigh.

Text is a pure function of (source, seed, index): `documents(...)` is what `data/generate_corpus.py` writes to
`data/corpus/*.parquet` and what tests call to make corpora of any size."""

from __future__ import annotations

import random

NAMES = ("Mia", "Tom", "Ava", "Leo", "Zoe", "Sam", "Ivy", "Max", "Nia", "Ben")
THINGS = ("shells", "apples", "stickers", "marbles", "books", "coins", "pencils", "cards")
FINDS = ("finds", "buys", "gets", "is given", "collects")
LOSES = ("gives away", "loses", "eats", "sells", "trades")
SOURCES = ("stories", "facts")


def _story(rng: random.Random) -> str:
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    have = rng.randint(2, 40)
    sentences = [f"{name} has {have} {thing}."]
    for _ in range(rng.randint(1, 4)):
        if have > 1 and rng.random() < 0.4:
            n = rng.randint(1, have - 1)
            sentences.append(f"{name} {rng.choice(LOSES)} {n}, so {name} has {have} - {n} = {have - n} {thing}.")
            have -= n
        else:
            n = rng.randint(1, 30)
            sentences.append(f"{name} {rng.choice(FINDS)} {n} more, so {name} has {have} + {n} = {have + n} "
                             f"{thing}.")
            have += n
    sentences.append(f"In the end {name} has {have} {thing}.")
    return " ".join(sentences)


def _facts(rng: random.Random) -> str:
    out = []
    for _ in range(rng.randint(3, 6)):
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        kind = rng.random()
        if kind < 0.4:
            out.append(f"{a} times {b} is {a * b}.")
        elif kind < 0.7:
            out.append(f"{a} plus {b} is {a + b}.")
        else:
            n = a * b
            out.append(f"{n} is {'even' if n % 2 == 0 else 'odd'}.")
    return " ".join(out)


def documents(source: str, n: int, seed: int = 0) -> list[str]:
    """The first n documents of `source` ("stories" or "facts")."""
    if source not in SOURCES:
        raise ValueError(f"unknown synthetic source {source!r}; known: {', '.join(SOURCES)}")
    make = _story if source == "stories" else _facts
    return [make(random.Random(f"{source}:{seed}:{i}")) for i in range(n)]
