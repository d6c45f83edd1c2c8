"""Named functions of the answer grammar: exact where the value is in our number system (sin of a multiple of
pi/12, log_2 8, 5!, C(5, 2), |-3|, floor 7/2), an opaque atom otherwise (compared structurally)."""

from __future__ import annotations

import math
from fractions import Fraction

from align.verify import algebra as A
from align.verify.algebra import Scalar
from align.verify.limits import Budget, OverBudget, Unsupported

TRIG = frozenset({"\\sin", "\\cos", "\\tan", "\\cot", "\\sec", "\\csc"})
OTHER_FUNCTIONS = frozenset({"\\log", "\\ln", "\\exp", "\\arcsin", "\\arccos", "\\arctan", "\\sinh", "\\cosh",
                             "\\tanh", "\\lg"})
FUNCTIONS = TRIG | OTHER_FUNCTIONS

# sin(k*pi/12) for k = 0..6 as (rational part, {radicand: coefficient}); the rest follows by symmetry.
_SIN_TWELFTHS = {
    0: {}, 1: {6: Fraction(1, 4), 2: Fraction(-1, 4)}, 2: {1: Fraction(1, 2)}, 3: {2: Fraction(1, 2)},
    4: {3: Fraction(1, 2)}, 5: {6: Fraction(1, 4), 2: Fraction(1, 4)}, 6: {1: Fraction(1)},
}


def _sin_twelfths(k: int) -> Scalar:
    k %= 24
    sign = 1
    if k >= 12:
        k, sign = k - 12, -1
    if k > 6:
        k = 12 - k
    return Scalar({(r, ()): c * sign for r, c in _SIN_TWELFTHS[k].items()})


def _pi_multiple(x: Scalar) -> Fraction | None:
    """q when x == q*pi exactly, else None."""
    if x.is_zero():
        return Fraction(0)
    if x.den is None and len(x.num) == 1:
        (mono, c), = x.num.items()
        if mono == (1, (("pi", 1),)):
            return c
    return None


def _sin_cos(x: Scalar, lim: Budget) -> tuple[Scalar, Scalar]:
    """sin x and cos x as atoms of the angle t when x = n t for an integer n, 1 <= |n| <= 3 (the double- and
    triple-angle formulas, odd sine, even cosine), else atoms of x itself."""
    n, t = 1, x
    if x.den is None and len(x.num) == 1:
        (mono, c), = x.num.items()
        if c.denominator == 1 and 1 <= abs(c.numerator) <= 3:
            n, t = int(c), Scalar({mono: Fraction(1)})
    s, c = A.opaque("sin", t), A.opaque("cos", t)
    k = abs(n)
    if k == 2:
        s, c = A.mul(A.const(2), A.mul(s, c, lim), lim), A.add(A.mul(c, c, lim), A.mul(s, s, lim), lim, -1)
    elif k == 3:
        s = A.add(A.mul(A.const(3), s, lim), A.mul(A.const(4), A.power_int(s, 3, lim), lim), lim, -1)
        c = A.add(A.mul(A.const(4), A.power_int(c, 3, lim), lim), A.mul(A.const(3), c, lim), lim, -1)
    return (A.neg(s) if n < 0 else s), c


def _special_part(x: Scalar) -> tuple[Scalar, Scalar] | None:
    """x = q pi + rest with 12 q an integer, q != 0 and rest != 0: (q pi, rest); else None."""
    mono = (1, (("pi", 1),))
    if x.den is not None or mono not in x.num or len(x.num) < 2 or (12 * x.num[mono]).denominator != 1:
        return None
    rest = Scalar({m: c for m, c in x.num.items() if m != mono})
    return Scalar({mono: x.num[mono]}), rest


def trig(name: str, x: Scalar, lim: Budget) -> Scalar:
    q = _pi_multiple(x)
    split = _special_part(x) if q is None else None
    if split is not None and name in ("\\sin", "\\cos"):
        # sin(90° - x) = cos x: the angle-sum formula with the special angle's exact sin and cos
        a, rest = split
        sa, ca, sr, cr = trig("\\sin", a, lim), trig("\\cos", a, lim), trig("\\sin", rest, lim), trig("\\cos", rest, lim)
        if name == "\\sin":
            return A.add(A.mul(sa, cr, lim), A.mul(ca, sr, lim), lim)
        return A.add(A.mul(ca, cr, lim), A.mul(sa, sr, lim), lim, -1)
    if split is not None:
        sin, cos = trig("\\sin", x, lim), trig("\\cos", x, lim)
        num, den = {"\\tan": (sin, cos), "\\cot": (cos, sin), "\\sec": (A.const(1), cos),
                    "\\csc": (A.const(1), sin)}[name]
        if den.is_zero():
            raise Unsupported(f"{name} undefined here")
        return A.div(num, den, lim)
    if q is None or (12 * q).denominator != 1:
        # tan, cot, sec, csc as quotients of sin and cos, so that identities between them can be decided
        # (equiv.py: sin^2 + cos^2 = 1); sin and cos of non-special angles stay atoms.
        sin, cos = _sin_cos(x, lim)
        num, den = {"\\sin": (sin, None), "\\cos": (cos, None), "\\tan": (sin, cos), "\\cot": (cos, sin),
                    "\\sec": (A.const(1), cos), "\\csc": (A.const(1), sin)}[name]
        return num if den is None else A.div(num, den, lim)
    k = int(12 * q)
    sin, cos = _sin_twelfths(k), _sin_twelfths(k + 6)
    num, den = {"\\sin": (sin, None), "\\cos": (cos, None), "\\tan": (sin, cos), "\\cot": (cos, sin),
                "\\sec": (A.const(1), cos), "\\csc": (A.const(1), sin)}[name]
    if den is None:
        return num
    if den.is_zero():
        raise Unsupported(f"{name} undefined at {q}*pi")
    return A.div(num, den, lim)


def logarithm(base: Scalar | None, x: Scalar, name: str, lim: Budget) -> Scalar:
    """log_base(x): exact when x = base^(p/q) for small q; `\\ln`/`\\log` without base only at x = 1."""
    qx = x.rational()
    if qx == 1:
        return A.const(0)
    qb = base.rational() if base is not None else None
    if qb is None or qx is None or qb <= 0 or qb == 1 or qx <= 0:
        return A.opaque("log", base if base is not None else A.symbol(name), x)
    estimate = (_log(qx)) / _log(qb)
    for q in range(1, 7):
        p = round(estimate * q)
        if abs(p) * max(qb.numerator.bit_length(), qb.denominator.bit_length()) > lim.max_bits:
            raise OverBudget("logarithm too large")
        if A.equal(A.power_int(A.const(qb), p, lim), A.power_int(A.const(qx), q, lim), lim):
            return A.const(Fraction(p, q))
    return A.opaque("log", base, x)


def _log(q: Fraction) -> float:
    return math.log(q.numerator) - math.log(q.denominator)


def _integer(x: Scalar, what: str) -> int:
    q = x.rational()
    if q is None or q.denominator != 1 or q < 0:
        raise Unsupported(f"{what} of a non-integer")
    return q.numerator


def factorial(x: Scalar, lim: Budget) -> Scalar:
    n = _integer(x, "factorial")
    if n > 2000:
        raise OverBudget("factorial too large")
    lim.spend(n)
    value = math.factorial(n)
    lim.check_int(value)
    return A.const(value)


def binomial(n_value: Scalar, k_value: Scalar, lim: Budget) -> Scalar:
    n, k = _integer(n_value, "binomial"), _integer(k_value, "binomial")
    if n > 20_000:
        raise OverBudget("binomial too large")
    lim.spend(min(k, n - k) + 1 if k <= n else 1)
    value = math.comb(n, k)
    lim.check_int(value)
    return A.const(value)


def absolute(x: Scalar, lim: Budget) -> Scalar:
    q = x.rational()
    if q is not None:
        return A.const(abs(q))
    modulus = _complex_modulus(x, lim)
    if modulus is not None:
        return modulus
    sign = _sign(x)
    if sign is None:
        return A.opaque("abs", x)
    return x if sign > 0 else A.neg(x)


def _complex_modulus(x: Scalar, lim: Budget) -> Scalar | None:
    """|a + bi| = sqrt(a^2 + b^2) for rational a, b."""
    if x.den is not None or x.atoms() != {A.IMAG}:
        return None
    a = x.num.get(A.ONE_MONO, Fraction(0))
    b = x.num.get((1, ((A.IMAG, 1),)))
    if b is None or len(x.num) != (2 if a else 1):
        return None
    return A.sqrt(A.const(a * a + b * b), lim)


def rounding(name: str, x: Scalar) -> Scalar:
    """floor / ceil: exact for rationals and for constants not within 1e-9 of an integer (float is safe there)."""
    q = x.rational()
    f = math.floor if name == "floor" else math.ceil
    if q is not None:
        return A.const(f(q))
    value = x.approx()
    if value is None or abs(value - round(value)) < 1e-9 or abs(value) > 2**50:
        return A.opaque(name, x)
    return A.const(f(value))


def _sign(x: Scalar) -> int | None:
    value = x.approx()
    if value is None or abs(value) < 1e-9 or math.isnan(value):
        return None
    return 1 if value > 0 else -1
