"""Exact scalar arithmetic: rational functions over Q(sqrt 2, sqrt 3, ...)[pi, variables, opaque atoms].

A Scalar is num/den, each a polynomial: {monomial: Fraction}. A monomial is (r, atoms): r a squarefree integer (the
square root it carries, 1 for none) and atoms a sorted tuple of (name, power) with integer, possibly negative,
powers. Square roots of distinct squarefree integers are linearly independent over Q and pi is transcendental, so
this form is canonical: two polynomials are equal exactly when their dicts are equal, and a/b == c/d exactly when
a*d == c*b. Nothing here evaluates floats except `approx`, used only for signs and the rounded-gold tolerance.

Every operation pays into a Budget (terms multiplied, bits produced), so no input can make it slow or huge.
"""

from __future__ import annotations

import re
from decimal import Context, Decimal
from fractions import Fraction
from math import gcd, isqrt, pi as PI_FLOAT, sqrt as float_sqrt

from align.verify.limits import Budget, OverBudget, Unsupported

ONE_MONO: tuple = (1, ())
_ONE = Fraction(1)


class Scalar:
    """An exact value; `lit` is the decimal literal it was read from ("-3.14"), if it is exactly one."""

    __slots__ = ("num", "den", "lit")

    def __init__(self, num: dict, den: dict | None = None, lit: str | None = None) -> None:
        self.num = num
        self.den = den
        self.lit = lit

    def is_zero(self) -> bool:
        return not self.num

    def rational(self) -> Fraction | None:
        """The value as a Fraction when it is rational, else None."""
        if self.den is not None:
            return None
        if not self.num:
            return Fraction(0)
        if len(self.num) == 1:
            return self.num.get(ONE_MONO)
        return None

    def atoms(self) -> set[str]:
        polys = (self.num,) if self.den is None else (self.num, self.den)
        return {name for p in polys for (_, names) in p for name, _ in names}

    def is_constant(self) -> bool:
        """No variables and no opaque atoms: a real number we can approximate."""
        return self.atoms() <= {"pi"}

    def approx(self) -> float | None:
        """A float approximation of a constant value, or None (variables, opaque atoms, overflow)."""
        if not self.is_constant():
            return None
        try:
            value = _poly_float(self.num)
            return value if self.den is None else value / _poly_float(self.den)
        except (OverflowError, ZeroDivisionError):
            return None

    def key(self) -> str:
        """A deterministic text form; canonical for polynomials (den None), used to name opaque atoms."""
        text = _poly_key(self.num)
        return text if self.den is None else f"({text})/({_poly_key(self.den)})"

    def __repr__(self) -> str:
        return f"Scalar({self.key()})"


def const(q: Fraction | int) -> Scalar:
    q = Fraction(q)
    return Scalar({ONE_MONO: q} if q else {})


def symbol(name: str) -> Scalar:
    """A variable ("v:x"), pi ("pi") or an opaque atom ("f:sin(...)") as a value."""
    return Scalar({(1, ((name, 1),)): _ONE})


def variable_name(s: Scalar) -> str | None:
    """The variable's name when `s` is exactly one bare variable, else None."""
    if s.den is None and len(s.num) == 1:
        ((r, names), coef), = s.num.items()
        if r == 1 and coef == 1 and len(names) == 1 and names[0][1] == 1 and names[0][0].startswith("v:"):
            return names[0][0][2:]
    return None


def _poly_float(p: dict) -> float:
    total = 0.0
    for (r, names), c in p.items():
        term = float(c) * (float_sqrt(r) if r > 1 else 1.0)
        for _, k in names:  # only "pi" reaches here (is_constant checked)
            term *= PI_FLOAT**k
        total += term
    return total


# pi to 80 places: enough for decimal_value at its largest precision.
_PI_DIGITS = Decimal("3.14159265358979323846264338327950288419716939937510582097494459230781640628620899862803")


def decimal_value(s: Scalar, prec: int) -> Decimal | None:
    """A constant value to `prec` significant digits (prec <= 60), or None (variables, opaque atoms, huge powers).
    Exact arithmetic on the Decimal side: only the square roots and pi are rounded, each to prec + 10 digits."""
    if not s.is_constant() or prec > 60:
        return None
    ctx = Context(prec=prec + 10)

    def poly(p: dict) -> Decimal:
        total = Decimal(0)
        for (r, names), c in p.items():
            term = ctx.divide(Decimal(c.numerator), Decimal(c.denominator))
            if r > 1:
                term = ctx.multiply(term, ctx.sqrt(Decimal(r)))
            for _, k in names:
                if abs(k) > 8:
                    raise OverflowError("power of pi")
                term = ctx.multiply(term, ctx.power(_PI_DIGITS, k))
            total = ctx.add(total, term)
        return total

    try:
        value = poly(s.num)
        return value if s.den is None else ctx.divide(value, poly(s.den))
    except (OverflowError, ArithmeticError):
        return None


def _poly_key(p: dict) -> str:
    if not p:
        return "0"
    parts = []
    for (r, names), c in sorted(p.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        factors = [str(c)] + ([f"sqrt{r}"] if r > 1 else []) + [f"{n}^{k}" for n, k in names]
        parts.append("*".join(factors))
    return " + ".join(parts)


IMAG = "v:i"  # the variable i is the imaginary unit: i^2 = -1 (what `i` means in every answer it appears in)


_SQRT_OF_VARIABLE = re.compile(r"f:sqrt\(1\*(v:[^^()*]+)\^1\)")


def _reduce_i(names: tuple) -> tuple[int, tuple]:
    """(sign, names) with i^k folded to i^(k mod 4): i^2 = -1, i^3 = -i, i^-1 = -i; and sqrt(x)^k, k >= 2 or k < 0,
    folded to x^(k // 2) sqrt(x)^(k % 2) (sqrt(x) is real only where x >= 0, and there its square is x)."""
    if any(n.startswith("f:sqrt(") and (k >= 2 or k < 0) for n, k in names):
        names = _fold_square_roots(names)
    for at, (name, k) in enumerate(names):
        if name == IMAG:
            if k == 1:
                return 1, names
            k %= 4
            rest = names[:at] + (((IMAG, 1),) if k % 2 else ()) + names[at + 1:]
            return (-1 if k >= 2 else 1), rest
    return 1, names


def _fold_square_roots(names: tuple) -> tuple:
    merged = dict(names)
    for name, k in names:
        m = _SQRT_OF_VARIABLE.fullmatch(name)
        if m and (k >= 2 or k < 0):  # 1/sqrt(x) = sqrt(x)/x: one form for both
            merged[m.group(1)] = merged.get(m.group(1), 0) + k // 2
            merged[name] = k % 2
    return tuple(sorted((n, k) for n, k in merged.items() if k))


def _mono_mul(a: tuple, b: tuple) -> tuple[int, tuple]:
    """(factor, monomial) with a*b = factor * monomial; sqrt(r1)*sqrt(r2) = g*sqrt(r1*r2/g^2), g = gcd; i^2 = -1."""
    ra, na = a
    rb, nb = b
    g = gcd(ra, rb) if ra > 1 and rb > 1 else 1
    if not na:
        names = nb
    elif not nb:
        names = na
    else:
        merged = dict(na)
        for name, k in nb:
            merged[name] = merged.get(name, 0) + k
        names = tuple(sorted((n, k) for n, k in merged.items() if k))
    sign, names = _reduce_i(names)
    return g * sign, ((ra // g) * (rb // g), names)


def _check_coef(c: Fraction, lim: Budget) -> None:
    lim.check_int(c.numerator)
    lim.check_int(c.denominator)


def _poly_mul(x: dict, y: dict, lim: Budget) -> dict:
    lim.spend(len(x) * len(y))
    out: dict = {}
    for mx, cx in x.items():
        for my, cy in y.items():
            g, m = _mono_mul(mx, my)
            c = cx * cy * g if g != 1 else cx * cy
            out[m] = out.get(m, 0) + c
    out = {m: c for m, c in out.items() if c}
    lim.check_terms(len(out))
    for c in out.values():
        _check_coef(c, lim)
    return out


def _poly_add(x: dict, y: dict, sign: int, lim: Budget) -> dict:
    lim.spend(len(y))
    out = dict(x)
    for m, c in y.items():
        v = out.get(m, 0) + (c if sign > 0 else -c)
        if v:
            out[m] = v
        else:
            out.pop(m, None)
    lim.check_terms(len(out))
    return out


def _normalize(num: dict, den: dict | None, lim: Budget) -> Scalar:
    """Fold a one-term denominator into the numerator (Laurent form) so simple quotients stay polynomials."""
    if not num:
        return Scalar({})
    if den is None:
        return Scalar(num)
    if len(den) == 1:
        ((r, names), c), = den.items()
        sign, inverted = _reduce_i(tuple((n, -k) for n, k in names))
        inverse = {(r, inverted): sign / (c * r)}
        return Scalar(_poly_mul(num, inverse, lim))
    # NOTE: a several-term denominator stays (equality cross-multiplies); scale it so its leading coefficient is 1,
    # which keeps keys of equal quotients equal in the common cases.
    lead = den[max(den)]
    if lead != 1:
        num = {m: c / lead for m, c in num.items()}
        den = {m: c / lead for m, c in den.items()}
    return Scalar(num, den)


def neg(a: Scalar) -> Scalar:
    lit = None if a.lit is None else (a.lit[1:] if a.lit.startswith("-") else "-" + a.lit)
    return Scalar({m: -c for m, c in a.num.items()}, a.den, lit)


def add(a: Scalar, b: Scalar, lim: Budget, sign: int = 1) -> Scalar:
    if a.den is None and b.den is None:
        return Scalar(_poly_add(a.num, b.num, sign, lim))
    one = {ONE_MONO: _ONE}
    ad, bd = a.den or one, b.den or one
    num = _poly_add(_poly_mul(a.num, bd, lim), _poly_mul(b.num, ad, lim), sign, lim)
    return _normalize(num, _poly_mul(ad, bd, lim), lim)


def mul(a: Scalar, b: Scalar, lim: Budget) -> Scalar:
    num = _poly_mul(a.num, b.num, lim)
    if a.den is None and b.den is None:
        return Scalar(num)
    one = {ONE_MONO: _ONE}
    return _normalize(num, _poly_mul(a.den or one, b.den or one, lim), lim)


def div(a: Scalar, b: Scalar, lim: Budget) -> Scalar:
    if b.is_zero():
        raise Unsupported("division by zero")
    one = {ONE_MONO: _ONE}
    return _normalize(_poly_mul(a.num, b.den or one, lim), _poly_mul(a.den or one, b.num, lim), lim)


def equal(a: Scalar, b: Scalar, lim: Budget) -> bool:
    if a.den is None and b.den is None:
        return a.num == b.num
    one = {ONE_MONO: _ONE}
    return _poly_mul(a.num, b.den or one, lim) == _poly_mul(b.num, a.den or one, lim)


def equal_mod_pythagoras(a: Scalar, b: Scalar, lim: Budget) -> bool:
    """a == b modulo sin(t)^2 + cos(t)^2 = 1 for every argument t: the cross-multiplied difference, cleared of
    negative powers, with each sin(t)^k (k >= 2) rewritten as sin(t)^(k-2) (1 - cos(t)^2) until none is left.
    The ideal is generated by one polynomial per argument in its own two variables, so the remainder is zero
    exactly when the difference vanishes on the circle. Every product pays into the Budget."""
    one = {ONE_MONO: _ONE}
    d = _poly_add(_poly_mul(a.num, b.den or one, lim), _poly_mul(b.num, a.den or one, lim), -1, lim)
    lowest: dict = {}
    for (_, names), _c in d.items():
        for name, k in names:
            if k < 0:
                lowest[name] = min(lowest.get(name, 0), k)
    if lowest:
        d = _poly_mul(d, {(1, tuple(sorted((n, -k) for n, k in lowest.items()))): _ONE}, lim)
    while d:
        at = next(((mono, c) for mono, c in d.items() for n, k in mono[1] if n.startswith("f:sin(") and k >= 2),
                  None)
        if at is None:
            return False
        (r, names), c = at
        sine = next(n for n, k in names if n.startswith("f:sin(") and k >= 2)
        lower = (r, tuple(sorted((n, k - 2 if n == sine else k) for n, k in names if k != 2 or n != sine)))
        cos_sq = {ONE_MONO: _ONE, (1, (("f:cos(" + sine[6:], 2),)): -_ONE}
        rest = {m: v for m, v in d.items() if m != (r, names)}
        d = _poly_add(rest, _poly_mul({lower: c}, cos_sq, lim), 1, lim)
    return True


def power_int(a: Scalar, n: int, lim: Budget) -> Scalar:
    if n == 0:
        if a.is_zero():
            raise Unsupported("0^0")
        return const(1)
    if a.is_zero():
        if n < 0:
            raise Unsupported("division by zero")
        return a
    e = abs(n)
    if a.den is None and len(a.num) == 1:
        ((r, names), c), = a.num.items()
        # NOTE: sizes are checked BEFORE computing: 10^{10^{10}} must be refused, not attempted.
        for part in (c.numerator, c.denominator, r):
            if part.bit_length() * e > lim.max_bits:
                raise OverBudget(f"power over {lim.max_bits} bits")
        lim.spend(len(names) + 1)
        coef = c**e * (r ** (e // 2) if r > 1 else 1)
        sign, powered = _reduce_i(tuple((nm, k * e) for nm, k in names))
        result = Scalar({(r if e % 2 else 1, powered): coef * sign})
    else:
        if e > 64:
            raise OverBudget("power of a sum over 64")
        result, base = const(1), a
        while e:
            if e & 1:
                result = mul(result, base, lim)
            e >>= 1
            if e:
                base = mul(base, base, lim)
    return div(const(1), result, lim) if n < 0 else result


def opaque(name: str, *args: Scalar) -> Scalar:
    """An uninterpreted atom, e.g. sin(1) or 2^x: equal only to the same atom with structurally equal arguments."""
    return symbol(f"f:{name}(" + ";".join(a.key() for a in args) + ")")


def _iroot(x: int, k: int) -> int:
    """floor(x ** (1/k)) for x >= 0, by integer Newton iteration."""
    if x < 2:
        return x
    g = 1 << -(-x.bit_length() // k)
    while True:
        y = ((k - 1) * g + x // g ** (k - 1)) // k
        if y >= g:
            return g
        g = y


def _square_split(n: int, lim: Budget) -> tuple[int, int]:
    """n = out^2 * core with core squarefree. Trial division to the cube root: what is left has at most two prime
    factors, so it is either a square or squarefree."""
    out, core, d = 1, 1, 2
    while d * d * d <= n:
        lim.spend()
        if n % d == 0:
            e = 0
            while n % d == 0:
                n //= d
                e += 1
            out *= d ** (e // 2)
            core *= d ** (e % 2)
        d += 1 if d == 2 else 2
    s = isqrt(n)
    if s * s == n:
        return out * s, core
    return out, core * n


def sqrt(a: Scalar, lim: Budget) -> Scalar:
    q = a.rational()
    if q is None:
        return _monomial_root(a, 2, lim)
    if q < 0:  # sqrt(-4) = 2i
        return mul(symbol(IMAG), sqrt(const(-q), lim), lim)
    n, d = q.numerator * q.denominator, q.denominator
    s = isqrt(n)
    if s * s == n:
        return const(Fraction(s, d))
    if n > lim.max_radicand:
        raise OverBudget("radicand too large to factor")
    out, core = _square_split(n, lim)
    return Scalar({(core, ()): Fraction(out, d)})


def root(a: Scalar, k: int, lim: Budget) -> Scalar:
    """The real k-th root, exact when `a` is a rational perfect k-th power, else an opaque atom."""
    if k == 2:
        return sqrt(a, lim)
    if k < 2 or k > 64:
        raise Unsupported(f"root of degree {k}")
    q = a.rational()
    if q is None:
        return _monomial_root(a, k, lim)
    if q < 0 and k % 2 == 0:
        raise Unsupported("even root of a negative number")
    p, d = abs(q.numerator), q.denominator
    rp, rd = _iroot(p, k), _iroot(d, k)
    if rp**k == p and rd**k == d:
        return const(Fraction(rp, rd) * (1 if q >= 0 else -1))
    return opaque(f"root{k}", a)


def _monomial_root(a: Scalar, k: int, lim: Budget) -> Scalar:
    """The k-th root of c * x^n * ... as a product of atom roots: `\\sqrt[3]{x^2}` is `\\sqrt[3]{x}^2`, which is
    how `x^{2/3}` is read too (power() raises first, then roots). Odd k; a square root only of odd powers (x^3 is
    real only for x >= 0, where its root is x sqrt(x); the root of x^2 is |x|, left alone)."""
    name_k = "sqrt" if k == 2 else f"root{k}"  # the same atom name sqrt() has always given
    if a.den is not None or len(a.num) != 1:
        return opaque(name_k, a)
    ((r, names), c), = a.num.items()
    if k % 2 == 0 and (k != 2 or any(n % 2 == 0 for _, n in names)):
        return opaque(name_k, a)
    coef = root(const(c), k, lim)
    if r != 1 or coef.rational() is None or any(not n.startswith("v:") for n, _ in names):
        return opaque(name_k, a)
    out = coef
    for name, n in names:  # x^n = x^(q k + m): its k-th root is x^q * root_k(x)^m, 0 <= m < k
        whole, rest = divmod(n, k)
        out = mul(out, power_int(symbol(name), whole, lim) if whole else const(1), lim)
        if rest:
            out = mul(out, power_int(opaque("sqrt" if k == 2 else f"root{k}", symbol(name)), rest, lim), lim)
    return out


def power(a: Scalar, e: Scalar, lim: Budget) -> Scalar:
    """a^e: exact for rational exponents when the result is expressible, else an opaque atom pow(a, e)."""
    q = e.rational()
    if q is None:
        return opaque("pow", a, e)
    if q.denominator == 1:
        return power_int(a, q.numerator, lim)
    if q.denominator > 64:
        return opaque("pow", a, e)
    if a.rational() is None and q.numerator > 0:  # x^{4/3} = root_3(x^4) = x * root_3(x): one canonical form
        return root(power_int(a, q.numerator, lim), q.denominator, lim)
    return power_int(root(a, q.denominator, lim), q.numerator, lim)
