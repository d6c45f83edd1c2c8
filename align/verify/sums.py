"""`\\sum_{k=lo}^{hi} body` as a value: a polynomial body in k has a closed form (Faulhaber), with numeric or
symbolic bounds (`\\sum_{k=1}^{n} k^2` is n(n+1)(2n+1)/6, `\\sum_{k=1}^{10} k` is 55); any other body is an atom
named by its bounds and its body with the index renamed, so `\\sum_{i=1}^n 2^i` equals `\\sum_{k=1}^n 2^k`."""

from __future__ import annotations

from fractions import Fraction
from functools import lru_cache
from math import comb

from align.verify import algebra as A
from align.verify.algebra import Scalar
from align.verify.limits import Budget

_MAX_POWER = 10  # sum of k^p for p up to this; beyond it the sum stays an atom


@lru_cache(maxsize=None)
def _bernoulli(n: int) -> Fraction:
    """B_n with B_1 = +1/2 (the convention in which sum_{k=1}^{n} k^p = F_p(n) below)."""
    if n == 0:
        return Fraction(1)
    return 1 - sum(comb(n, j) * _bernoulli(j) / (n - j + 1) for j in range(n))


def _power_sum(p: int, n: Scalar, lim: Budget) -> Scalar:
    """sum_{k=1}^{n} k^p = 1/(p+1) sum_j C(p+1, j) B_j n^(p+1-j)."""
    total = A.const(0)
    for j in range(p + 1):
        coef = Fraction(comb(p + 1, j)) * _bernoulli(j) / (p + 1)
        if coef:
            total = A.add(total, A.mul(A.const(coef), A.power_int(n, p + 1 - j, lim), lim), lim)
    return total


def finite_or_closed_sum(index: str, lo: Scalar, hi: Scalar, body: Scalar, lim: Budget) -> Scalar:
    """The sum of `body` (in the variable named `index`) for index = lo..hi."""
    terms: dict[int, dict] = {}  # power of the index -> the rest of the body's monomials
    # a polynomial in the index: no denominator, and the index inside no other atom (sin k, 2^k)
    closed = body.den is None and not any(index in n and n != index for n in body.atoms())
    if closed:
        for (r, names), c in body.num.items():
            p = dict(names).get(index, 0)
            if p < 0 or p > _MAX_POWER:
                closed = False
                break
            rest = (r, tuple((n, k) for n, k in names if n != index))
            terms.setdefault(p, {})[rest] = c
    if not closed:
        return A.symbol(f"f:sum({lo.key()};{hi.key()};{body.key()})")
    total = A.const(0)
    below = A.add(lo, A.const(1), lim, -1)
    for p, rest in sorted(terms.items()):
        lim.spend(p + 1)
        span = A.add(_power_sum(p, hi, lim), _power_sum(p, below, lim), lim, -1)
        total = A.add(total, A.mul(Scalar(rest), span, lim), lim)
    return total
