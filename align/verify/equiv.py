"""When a predicted Value equals the gold Value.

Exact by default: rational and algebraic values compare exactly, tuples and intervals element-wise (open and
closed ends distinct), sets and unions order-free. Two documented leniencies:

- Percent (VerifyConfig.percent): gold `25\\%` accepts 25 and 0.25 under "either".
- Rounded gold (VerifyConfig.rounded_gold_min_sig_digits): a gold written as a decimal with >= 3 significant digits
  (`0.333`, `3.14`) accepts a prediction whose exact value has no finite decimal expansion of that length (1/3, pi)
  when that value rounds to the gold at the gold's number of places. The gold was clearly rounded; a prediction
  that is itself a terminating decimal (3.141) must match exactly.

Not symmetric: the gold decides tolerances. A one-element set equals its element (adjacent identical boxes are one
answer), an assignment `x = 5` equals 5.
"""

from __future__ import annotations

from decimal import ROUND_DOWN, ROUND_HALF_UP, Context, Decimal
from fractions import Fraction

from align.verify import algebra as A
from align.verify.algebra import Scalar
from align.verify.config import VerifyConfig
from align.verify.limits import Budget
from align.verify.structures import is_label
from align.verify.values import (Based, Degrees, FiniteSet, Infinity, Interval, List, Matrix, PairParen, Percent,
                                 Ratio, Relation, Text, Time, Tuple, Union, Value)


def _non_terminating(v: Scalar) -> bool:
    """True when v's exact value has no finite decimal expansion (a 2^a 5^b denominator is terminating)."""
    q = v.rational()
    if q is None:
        return True
    d = q.denominator
    for p in (2, 5):
        while d % p == 0:
            d //= p
    return d != 1


def _rounded_gold_match(gold: Scalar, pred: Scalar, cfg: VerifyConfig) -> bool:
    lit = gold.lit
    if lit is None or cfg.rounded_gold_min_sig_digits == 0 or not pred.is_constant() or not _non_terminating(pred):
        return False
    digits = lit.lstrip("-").replace(".", "").lstrip("0")
    if len(digits) < cfg.rounded_gold_min_sig_digits:
        return False
    places = len(lit.partition(".")[2])
    target = Fraction(lit) * 10**places  # an integer
    q = pred.rational()
    if q is not None:
        scaled = q * 10**places
        return abs(scaled - target) < Fraction(1, 2)  # never exactly 1/2 away: pred does not terminate there
    value = pred.approx()
    if value is None:
        return False
    if abs(value) * 10**places <= 2**50:
        return abs(value * 10**places - float(target)) < 0.5
    exact = A.decimal_value(pred, len(lit) + 5)  # more places than a double holds: exact decimals
    return exact is not None and abs(exact.scaleb(places) - Decimal(int(target))) < Decimal("0.5")


def _decimal_prediction_match(gold: Scalar, pred: Scalar, cfg: VerifyConfig) -> bool:
    """VerifyConfig.decimal_min_sig_digits: a decimal prediction of a non-terminating exact gold, rounded or
    truncated at its own places, or printed from a double."""
    lit = pred.lit
    if lit is None or cfg.decimal_min_sig_digits == 0 or gold.lit is not None or not _non_terminating(gold):
        return False
    digits = lit.lstrip("-").replace(".", "").lstrip("0")
    places = len(lit.partition(".")[2])
    if len(digits) < cfg.decimal_min_sig_digits or places > 40 or len(lit) > 45:
        return False
    exact = A.decimal_value(gold, len(lit) + 5)
    if exact is None:
        return False
    written = Decimal(lit)
    unit = Decimal(1).scaleb(-places)
    ctx = Context(prec=60)
    if written in (exact.quantize(unit, ROUND_HALF_UP, ctx), exact.quantize(unit, ROUND_DOWN, ctx)):
        return True
    return abs(written - exact) <= abs(exact) * Decimal(2) ** -52  # a double printed in full (repr)


def _identity_equal(g: Scalar, p: Scalar, lim: Budget) -> bool:
    """Equal once sin^2 t + cos^2 t = 1 is applied (tan, cot, sec, csc are read as quotients of sin and cos)."""
    atoms = g.atoms() | p.atoms()
    return any(a.startswith(("f:sin(", "f:cos(")) for a in atoms) and A.equal_mod_pythagoras(g, p, lim)


def _scalar_equal(g: Scalar, p: Scalar, cfg: VerifyConfig, lim: Budget) -> bool:
    return (A.equal(g, p, lim) or _rounded_gold_match(g, p, cfg) or _decimal_prediction_match(g, p, cfg)
            or _identity_equal(g, p, lim))


def _percent_forms(v: Percent, cfg: VerifyConfig, lim: Budget) -> list[Scalar]:
    as_fraction = A.div(v.value, A.const(100), lim)
    return {"either": [v.value, as_fraction], "fraction": [as_fraction], "number": [v.value]}[cfg.percent]


def _angle_forms(v: Degrees, lim: Budget) -> list[Scalar]:
    """An angle in degrees as written and in radians: `30^\\circ` is 30 and pi/6."""
    return [v.value, A.div(A.mul(v.value, A.symbol("pi"), lim), A.const(180), lim)]


def _based_equal(g: Based, p: Value, cfg: VerifyConfig, lim: Budget) -> bool:
    """A based gold accepts the same number in any base, or its digits without the subscript (the question asked
    for base b): `204_5` accepts `204_5`, `204`, `1010100_2`; not 54, which is the value in base ten."""
    if isinstance(p, Based):
        return values_equal(g.value, p.value, cfg, lim)
    q = p.rational() if isinstance(p, Scalar) else None
    if q is None or q.denominator != 1 or q < 0 or len(str(q.numerator)) > 64:
        return False
    digits = str(q.numerator)
    return all(int(d) < g.base for d in digits) and int(digits, g.base) == g.value.rational()


def _vector(v: Value) -> tuple | None:
    """The entries of a one-row or one-column matrix, or of a parenthesised tuple."""
    if isinstance(v, Matrix):
        if len(v.rows) == 1:
            return v.rows[0]
        if all(len(r) == 1 for r in v.rows):
            return tuple(r[0] for r in v.rows)
        return None
    if isinstance(v, PairParen):
        return (v.a, v.b)
    if isinstance(v, Interval) and v.lo_closed and v.hi_closed:  # `[0.5, 1]` written as a list
        return (v.lo, v.hi)
    return v.items if isinstance(v, Tuple) else None


def _matrix_equal(g: Value, p: Value, cfg: VerifyConfig, lim: Budget) -> bool:
    if isinstance(g, Matrix) and isinstance(p, Matrix):
        return (len(g.rows) == len(p.rows) and len(g.rows[0]) == len(p.rows[0])
                and all(_seq_equal(gr, pr, cfg, lim) for gr, pr in zip(g.rows, p.rows)))
    gv, pv = _vector(g), _vector(p)  # a column vector gold accepts `(1, 2)`, and the other way round
    return gv is not None and pv is not None and _seq_equal(gv, pv, cfg, lim)


def _bound_equal(g: object, p: object, cfg: VerifyConfig, lim: Budget) -> bool:
    if isinstance(g, Infinity) or isinstance(p, Infinity):
        return isinstance(g, Infinity) and isinstance(p, Infinity) and g.sign == p.sign
    return values_equal(g, p, cfg, lim)


def _interval_like(v: Value) -> Interval | None:
    if isinstance(v, Interval):
        return v
    if isinstance(v, PairParen) and all(isinstance(x, (Scalar, Infinity)) for x in (v.a, v.b)):
        return Interval(v.a, v.b, False, False)
    return None


def _canonical_keys(items: tuple, gold: bool) -> set[str] | None:
    """Keys that decide equality on their own: polynomials (canonical form) with no rounded-gold decimal."""
    keys = set()
    for x in items:
        if not isinstance(x, Scalar) or x.den is not None or (gold and x.lit is not None):
            return None
        keys.add(x.key())
    return keys


def _set_equal(gs: tuple, ps: tuple, cfg: VerifyConfig, lim: Budget) -> bool:
    gk, pk = _canonical_keys(gs, True), _canonical_keys(ps, False)
    if gk is not None and pk is not None:  # NOTE: O(n) instead of O(n*m) for long answer lists
        lim.spend(len(gs) + len(ps))
        return gk == pk
    lim.spend(len(gs) * len(ps))
    return (all(any(values_equal(g, p, cfg, lim) for p in ps) for g in gs)
            and all(any(values_equal(g, p, cfg, lim) for g in gs) for p in ps))


def _seq_equal(gs: tuple, ps: tuple, cfg: VerifyConfig, lim: Budget) -> bool:
    return len(gs) == len(ps) and all(values_equal(g, p, cfg, lim) for g, p in zip(gs, ps))


def _union_like(v: Value) -> bool:
    return isinstance(v, Union) or (isinstance(v, List) and all(isinstance(x, Interval) for x in v.items))


def _union_parts(v: Value) -> tuple:
    """A union's parts, overlapping or touching intervals merged; a list of intervals (`x < -1 \\text{ or } x > 2`)
    is their union too."""
    if isinstance(v, Union):
        return _merged(v.parts)
    return _merged(v.items) if _union_like(v) else (v,)


def _end(b: object) -> Fraction | float | None:
    if isinstance(b, Infinity):
        return float("inf") * b.sign
    return b.rational() if isinstance(b, Scalar) else None


def _merged(parts: tuple) -> tuple:
    """`(-\\infty, 1) \\cup [1, 2]` is `(-\\infty, 2]`: merged when every part is an interval with rational or
    infinite ends (exact comparisons only); otherwise the parts as written."""
    spans = [_interval_like(p) for p in parts]
    if any(s is None or _end(s.lo) is None or _end(s.hi) is None for s in spans):
        return parts
    spans.sort(key=lambda s: (_end(s.lo), not s.lo_closed))
    out = [spans[0]]
    for s in spans[1:]:
        cur = out[-1]
        lo, hi, s_hi = _end(s.lo), _end(cur.hi), _end(s.hi)
        if lo < hi or (lo == hi and (cur.hi_closed or s.lo_closed)):  # they overlap or touch: one interval
            if s_hi > hi or (s_hi == hi and s.hi_closed):
                out[-1] = Interval(cur.lo, s.hi, cur.lo_closed, s.hi_closed or (s_hi == hi and cur.hi_closed))
        else:
            out.append(s)
    return tuple(out)


def _list_equal(g: Value, p: Value, cfg: VerifyConfig, lim: Budget) -> bool:
    """A gold list against a list or a set: ordered (items as written) unless cfg.unordered_lists; a gold set
    against a list: order-free."""
    gi, pi = g.items, p.items
    # A list of tuples is a list of solutions (`(2,9),(9,2)`), which no question orders.
    tuples = all(isinstance(x, (PairParen, Tuple)) for x in gi)
    if isinstance(g, FiniteSet) or cfg.unordered_lists or tuples:
        return _set_equal(gi, pi, cfg, lim)
    return _seq_equal(gi, pi, cfg, lim)


def _structured_equal(g: Value, p: Value, cfg: VerifyConfig, lim: Budget) -> bool:
    if isinstance(g, (PairParen, Tuple)) and isinstance(p, (PairParen, Tuple)):
        gi = (g.a, g.b) if isinstance(g, PairParen) else g.items
        pi = (p.a, p.b) if isinstance(p, PairParen) else p.items
        return _seq_equal(gi, pi, cfg, lim)
    gi, pi = _interval_like(g), _interval_like(p)
    if gi is not None and pi is not None:
        return (gi.lo_closed == pi.lo_closed and gi.hi_closed == pi.hi_closed
                and _bound_equal(gi.lo, pi.lo, cfg, lim) and _bound_equal(gi.hi, pi.hi, cfg, lim))
    return False


def values_equal(g: Value, p: Value, cfg: VerifyConfig, lim: Budget) -> bool:
    """Does prediction `p` match gold `g`? (Not symmetric: tolerances follow the gold.)"""
    lim.spend()
    if isinstance(g, Scalar) and isinstance(p, Scalar):
        return _scalar_equal(g, p, cfg, lim)
    if isinstance(g, Relation) and isinstance(p, Relation):  # before sets: `x = \\pm 1` is the set {1, -1}
        return _relation_equal(g, p, cfg, lim)
    if cfg.assignment_is_value and isinstance(g, Relation) and g.op == "=" and A.variable_name(g.lhs) is not None:
        return values_equal(g.rhs, p, cfg, lim)
    if cfg.assignment_is_value and isinstance(p, Relation) and p.op == "=" and _labelled(p):
        return values_equal(g, p.rhs, cfg, lim)
    if isinstance(g, Ratio) or isinstance(p, Ratio) or isinstance(g, Time) or isinstance(p, Time):
        return _ratio_or_time_equal(g, p, lim)
    if isinstance(g, Percent) or isinstance(p, Percent):
        if isinstance(g, Percent) and isinstance(p, Percent):
            return values_equal(g.value, p.value, cfg, lim)
        if isinstance(g, Percent):
            return any(values_equal(form, p, cfg, lim) for form in _percent_forms(g, cfg, lim))
        return any(values_equal(g, form, cfg, lim) for form in _percent_forms(p, cfg, lim))
    if isinstance(g, Degrees) or isinstance(p, Degrees):
        if isinstance(g, Degrees) and isinstance(p, Degrees):
            return values_equal(g.value, p.value, cfg, lim)
        if isinstance(g, Degrees):
            return any(values_equal(form, p, cfg, lim) for form in _angle_forms(g, lim))
        return any(values_equal(g, form, cfg, lim) for form in _angle_forms(p, lim))
    if isinstance(g, Based):
        return _based_equal(g, p, cfg, lim)
    if isinstance(p, Based):
        return values_equal(g, p.value, cfg, lim)
    if isinstance(g, Matrix) or isinstance(p, Matrix):
        return _matrix_equal(g, p, cfg, lim)
    if isinstance(g, FiniteSet) and isinstance(p, FiniteSet):
        return _set_equal(g.items, p.items, cfg, lim)
    if _union_like(g) or _union_like(p):
        return _set_equal(_union_parts(g), _union_parts(p), cfg, lim)
    if isinstance(g, (List, FiniteSet)) and isinstance(p, (List, FiniteSet)):
        return _list_equal(g, p, cfg, lim)
    if isinstance(g, List) or isinstance(p, List):  # a list (2+ items) is never one value
        return False
    if isinstance(g, FiniteSet):  # a set whose every element is p: `\{3\}`, or the same box twice
        return bool(g.items) and all(values_equal(x, p, cfg, lim) for x in g.items)
    if isinstance(p, FiniteSet):
        return bool(p.items) and all(values_equal(g, x, cfg, lim) for x in p.items)
    if isinstance(g, Infinity) and isinstance(p, Infinity):
        return g.sign == p.sign
    if isinstance(g, Text) and isinstance(p, Text):
        return g.text == p.text
    return _structured_equal(g, p, cfg, lim)


def _labelled(p: Relation) -> bool:
    """`x = 5`, and on the prediction's side a name for the value asked: `|PQ| = 2`, `XY = 3`, `m + n = 7` (names
    with no coefficient, equal to a constant)."""
    if A.variable_name(p.lhs) is not None:
        return True
    return is_label(p.lhs, sums=True) and (not isinstance(p.rhs, Scalar) or p.rhs.is_constant())


def _ratio_or_time_equal(g: Value, p: Value, lim: Budget) -> bool:
    if isinstance(g, Time) and isinstance(p, Time):
        return g.seconds == p.seconds
    if not (isinstance(g, Ratio) and isinstance(p, Ratio)) or len(g.items) != len(p.items):
        return False
    gs, ps = g.items, p.items
    if not all(isinstance(x, Scalar) and not x.is_zero() for x in gs + ps):
        return False
    # proportional parts: 5:9 is 10:18 (g_k p_0 == p_k g_0 for every k)
    return all(A.equal(A.mul(gk, ps[0], lim), A.mul(pk, gs[0], lim), lim) for gk, pk in zip(gs[1:], ps[1:]))


def _graph_names(g: Relation, p: Relation) -> bool:
    """`f(x) = 2x + 3` and `y = 2x + 3` name the same graph: y is the function's value."""
    names = {A.variable_name(g.lhs), A.variable_name(p.lhs)}
    return "y" in names and any(n and n.endswith("(x)") and len(n) == 4 for n in names)


def _relation_equal(g: Relation, p: Relation, cfg: VerifyConfig, lim: Budget) -> bool:
    if g.op != p.op:
        return False
    if g.op == "=" and _graph_names(g, p):
        return values_equal(g.rhs, p.rhs, cfg, lim)
    same = values_equal(g.lhs, p.lhs, cfg, lim) and values_equal(g.rhs, p.rhs, cfg, lim)
    if same:
        return True
    if g.op in ("=", "!=") and values_equal(g.lhs, p.rhs, cfg, lim) and values_equal(g.rhs, p.lhs, cfg, lim):
        return True
    return _proportional(g, p, lim)


def _proportional(g: Relation, p: Relation, lim: Budget) -> bool:
    """The same relation written with both sides scaled: `2y = 4x + 2` is `y = 2x + 1`, `-x - y > -1` is `x + y < 1`
    (rhs - lhs scaled by a constant c, c > 0 for an inequality). Polynomials only: their form is canonical."""
    if not all(isinstance(v, Scalar) and v.den is None for v in (g.lhs, g.rhs, p.lhs, p.rhs)):
        return False
    dg, dp = A.add(g.rhs, g.lhs, lim, -1), A.add(p.rhs, p.lhs, lim, -1)
    if dg.is_zero() or dp.is_zero() or len(dg.num) != len(dp.num):
        return False
    mono, coef = next(iter(dg.num.items()))
    if mono not in dp.num:
        return False
    c = dp.num[mono] / coef
    if g.op in ("<", "<=") and c < 0:
        return False
    return A.equal(A.mul(dg, A.const(c), lim), dp, lim)
