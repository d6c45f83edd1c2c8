"""The shapes an answer can take besides a plain Scalar. Plain immutable records; comparison lives in equiv.py."""

from __future__ import annotations

from dataclasses import dataclass

from align.verify.algebra import Scalar


@dataclass(frozen=True, eq=False)
class Infinity:
    sign: int  # +1 or -1


@dataclass(frozen=True, eq=False)
class Percent:
    """`25%` as written: compared with a plain number according to VerifyConfig.percent."""

    value: Scalar


@dataclass(frozen=True, eq=False)
class Degrees:
    """`30^\\circ` as written: an angle the gold or prediction says is in degrees (equiv.py: pi/6 is 30 degrees)."""

    value: Scalar


@dataclass(frozen=True, eq=False)
class Based:
    """`204_5`: an integer written in base `base` (2..36); `value` is what it is worth."""

    digits: str
    base: int
    value: Scalar


@dataclass(frozen=True, eq=False)
class Matrix:
    """`\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}`: rows of entries, compared entry by entry."""

    rows: tuple  # of tuples


@dataclass(frozen=True, eq=False)
class Interval:
    lo: Scalar | Infinity
    hi: Scalar | Infinity
    lo_closed: bool
    hi_closed: bool


@dataclass(frozen=True, eq=False)
class PairParen:
    """`(a, b)`: an ordered pair or an open interval; which one only the question knows, so it matches both."""

    a: object
    b: object


@dataclass(frozen=True, eq=False)
class Tuple:
    items: tuple


@dataclass(frozen=True, eq=False)
class List:
    """A top-level comma list `10, 4, -2` (or adjacent boxes): ordered, unless the gold is a set or
    VerifyConfig.unordered_lists says so."""

    items: tuple


@dataclass(frozen=True, eq=False)
class FiniteSet:
    """Order-free, duplicates irrelevant: `\\{1, 2\\}`, `1 \\pm 2`."""

    items: tuple
    from_pm: bool = False  # made by `\\pm`: arithmetic applies to each element (`\\frac{-1 \\pm \\sqrt5}{2}`)


@dataclass(frozen=True, eq=False)
class Union:
    parts: tuple  # of Interval / PairParen / FiniteSet


@dataclass(frozen=True, eq=False)
class Relation:
    """`lhs op rhs` with op in {"=", "<", "<=", "!="}; `a > b` is stored as `b < a`."""

    op: str
    lhs: Scalar
    rhs: object  # a Scalar, or any answer after an assignment (`x = \\pm 1`, `x = (1, 2)`)


@dataclass(frozen=True, eq=False)
class Ratio:
    """`5:9` (two or more parts): equal to any ratio of proportional parts (`10:18`)."""

    items: tuple


@dataclass(frozen=True, eq=False)
class Time:
    """A clock time `10:30` or `10:30:00`, as seconds after midnight."""

    seconds: int


@dataclass(frozen=True, eq=False)
class Text:
    """A word answer (`\\text{Evelyn}`, `yes`), lower-cased with spaces collapsed."""

    text: str


Value = (Scalar | Infinity | Percent | Degrees | Based | Matrix | Interval | PairParen | Tuple | List | FiniteSet
         | Union | Relation | Ratio | Time | Text)
