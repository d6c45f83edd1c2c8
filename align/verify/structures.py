"""Building structured answers from parsed parts: brackets (tuple / interval / grouping), relations (equations,
inequalities, chains) and unions. Relations of one variable against constants become the interval they describe,
so `x \\le 3` and `(-\\infty, 3]` are the same answer."""

from __future__ import annotations

from fractions import Fraction

from align.verify import algebra as A
from align.verify.algebra import Scalar
from align.verify.limits import Budget, Unsupported
from align.verify.values import FiniteSet, Infinity, Interval, PairParen, Ratio, Relation, Tuple, Union, Value

_FLIP = {">": "<", ">=": "<="}


def bracket_value(opener: str, closer: str, items: list[Value]) -> Value:
    matched = (opener, closer) in (("(", ")"), ("[", "]"))
    if len(items) == 1:
        if not matched:
            raise Unsupported(f"{opener}...{closer} around one item")
        return items[0]
    if len(items) == 2:
        if (opener, closer) == ("(", ")"):
            return PairParen(items[0], items[1])
        lo, hi = items
        if not isinstance(lo, (Scalar, Infinity)) or not isinstance(hi, (Scalar, Infinity)):
            raise Unsupported("interval bounds must be numbers")
        return Interval(lo, hi, opener == "[", closer == "]")
    if not matched:
        raise Unsupported(f"{opener}...{closer} around {len(items)} items")
    return Tuple(tuple(items))


def union_value(a: Value, b: Value) -> Union:
    parts = []
    for v in (a, b):
        if isinstance(v, Union):
            parts.extend(v.parts)
        elif isinstance(v, (Interval, PairParen, FiniteSet)):
            parts.append(v)
        else:
            raise Unsupported(f"union of {type(v).__name__}")
    return Union(tuple(parts))


def is_label(v: object, sums: bool = False) -> bool:
    """A name for a quantity, not a formula: a product of distinct variables or absolute values (`x`, `XY`, `g x`
    as `g(x)` reads, `|PQ|`), each to the first power with coefficient 1; with `sums`, a sum of such names with no
    constant term (`m + n`)."""
    if not isinstance(v, Scalar) or v.den is not None or not v.num or (len(v.num) > 1 and not sums):
        return False
    for (r, names), c in v.num.items():
        if c != 1 or r != 1 or not names or any(k != 1 for _, k in names):
            return False
        if any(not (n.startswith("v:") and not n.startswith("v:#")) and not _segment_length(n) for n, _ in names):
            return False
    return True


def _segment_length(name: str) -> bool:
    """|PQ|: the absolute value of a product of two or more names (a length); |x| = 5 is the set {-5, 5}."""
    return name.startswith("f:abs(1*") and name.count("v:") >= 2 and name.count("v:#") == 0


def _names(v: Value) -> bool:
    """A tuple or ratio of names: `(a, b)`, `S_1 : S_2`."""
    items = (v.a, v.b) if isinstance(v, PairParen) else v.items if isinstance(v, (Tuple, Ratio)) else ()
    return bool(items) and all(is_label(x) for x in items)


def _is_constant(v: Value) -> bool:
    return isinstance(v, Infinity) or (isinstance(v, Scalar) and v.is_constant())


def _equal_chain(parts: list[Value], lim: Budget) -> bool:
    if not all(isinstance(p, Scalar) for p in parts):
        raise Unsupported("chain of equalities between non-numbers")
    return all(A.equal(parts[k], parts[k + 1], lim) for k in range(len(parts) - 1))


def _equations(parts: list[Value], lim: Budget) -> Value:
    """`x = 5` is an assignment; `x = 2 + 3 = 5` too (its right-hand sides must agree); `2 + 3 = 5` is 5 only if it
    is true; `5 = 6` is refused (a false statement must not score as its right-hand side)."""
    first = parts[0]
    if len(parts) == 2 and _names(first) and not _names(parts[1]):  # `(a, b) = (4, 1)`, `S_1:S_2 = 5:9`
        return parts[1]
    if isinstance(first, Scalar) and A.variable_name(first) is not None:
        rest = parts[1:]
        if len(rest) > 1 and not _equal_chain(rest, lim):
            raise Unsupported("inconsistent chain of equalities")
        return Relation("=", first, rest[-1])
    if all(_is_constant(p) for p in parts):
        if not _equal_chain(parts, lim):
            raise Unsupported("false equation")
        return parts[-1]
    if len(parts) == 2 and all(isinstance(p, Scalar) for p in parts):
        return Relation("=", parts[0], parts[1])
    raise Unsupported("equation chain")


def _interval_from(var_side: str, op: str, bound: Value) -> Interval:
    """x op c (var_side 'left') or c op x (var_side 'right'), op in {<, <=}."""
    closed = op == "<="
    if var_side == "left":
        return Interval(Infinity(-1), bound, False, closed)
    return Interval(bound, Infinity(1), closed, False)


def _linear(v: Value, lim: Budget) -> tuple[str, Fraction, Scalar] | None:
    """(x, a, b) when v = a*x + b with one variable x, a rational a != 0 and a constant b; else None."""
    if not isinstance(v, Scalar) or v.den is None and not v.num:
        return None
    names = v.atoms() - {"pi"}
    if len(names) != 1 or v.den is not None:
        return None
    name = next(iter(names))
    if not name.startswith("v:"):
        return None
    x_mono = (1, ((name, 1),))
    a = v.num.get(x_mono)
    if a is None:
        return None
    b = A.add(v, A.mul(A.symbol(name), A.const(a), lim), lim, -1)
    return (name, a, b) if b.is_constant() else None


def _solve_linear(lhs: Value, op: str, rhs: Value, lim: Budget) -> Interval | None:
    """lhs op rhs (op < or <=) as the interval of its one variable, when rhs - lhs is linear in it: `-x > -1` is
    `x < 1`, `2x + 1 \\le 7` is `(-\\infty, 3]`."""
    if not isinstance(lhs, Scalar) or not isinstance(rhs, Scalar):
        return None
    lin = _linear(A.add(rhs, lhs, lim, -1), lim)
    if lin is None:
        return None
    _, a, b = lin  # a*x + b > 0 (or >= 0)
    bound = A.div(A.neg(b), A.const(a), lim)
    return _interval_from("right" if a > 0 else "left", op, bound)


def _intersect(a: Interval, b: Interval) -> Interval:
    """Two half-lines of one variable (from a linear chain) as one interval: their finite ends, whatever side."""
    lo = a if isinstance(a.hi, Infinity) else b
    hi = b if lo is a else a
    if not isinstance(lo.hi, Infinity) or not isinstance(hi.lo, Infinity):
        raise Unsupported("inequality chain")
    return Interval(lo.lo, hi.hi, lo.lo_closed, hi.hi_closed)


def _abs_of_variable(v: Value) -> bool:
    """|x| for one variable x (an atom abs(x))."""
    if not (isinstance(v, Scalar) and v.den is None and len(v.num) == 1):
        return False
    ((r, names), c), = v.num.items()
    return (c == 1 and r == 1 and len(names) == 1 and names[0][1] == 1 and names[0][0].startswith("f:abs(1*v:")
            and names[0][0].count("*") == 1 and "v:#" not in names[0][0])


def _abs_set(lo: Value | None, lo_op: str, hi: Value | None, hi_op: str) -> Value:
    """lo op |x| op hi (either side may be missing) as a set of x: `|x| < 3` is (-3, 3), `2 \\le |x| \\le 3` is
    [-3, -2] U [2, 3], `|x| > 2` is (-inf, -2) U (2, inf). Rational bounds only."""
    low = lo.rational() if isinstance(lo, Scalar) else (None if lo is not None else Fraction(0))
    high = hi.rational() if isinstance(hi, Scalar) else None
    if low is None or (hi is not None and high is None) or low < 0 or (high is not None and high < low):
        raise Unsupported("absolute value bound")
    lo_closed = lo is None or lo_op == "<="
    if high is None:
        if lo is None or low == 0:
            raise Unsupported("absolute value bound")
        return Union((Interval(Infinity(-1), A.const(-low), False, lo_closed),
                      Interval(A.const(low), Infinity(1), lo_closed, False)))
    hi_closed = hi_op == "<="
    if lo is None:
        return Interval(A.const(-high), A.const(high), hi_closed, hi_closed)
    return Union((Interval(A.const(-high), A.const(-low), hi_closed, lo_closed),
                  Interval(A.const(low), A.const(high), lo_closed, hi_closed)))


def _inequality(parts: list[Value], ops: list[str], lim: Budget) -> Value:
    if len(parts) == 2 and "!=" not in ops:
        op, lhs, rhs = ops[0], parts[0], parts[1]
        if op in _FLIP:
            op, lhs, rhs = _FLIP[op], rhs, lhs
        if _abs_of_variable(lhs) and _is_constant(rhs):
            return _abs_set(None, op, rhs, op)
        if _abs_of_variable(rhs) and _is_constant(lhs):
            return _abs_set(lhs, op, None, op)
    if len(parts) == 3 and "!=" not in ops and _abs_of_variable(parts[1]):
        lo, hi, o = parts[0], parts[2], ops
        if all(x in _FLIP for x in o):
            lo, hi, o = hi, lo, [_FLIP[x] for x in reversed(o)]
        if all(x in ("<", "<=") for x in o) and _is_constant(lo) and _is_constant(hi):
            return _abs_set(lo, o[0], hi, o[1])
    if len(parts) == 2:
        op, lhs, rhs = ops[0], parts[0], parts[1]
        if op in _FLIP:
            op, lhs, rhs = _FLIP[op], rhs, lhs
        if op == "!=":
            for var, bound in ((lhs, rhs), (rhs, lhs)):  # `x \\ne 2`: the line without one point
                if isinstance(var, Scalar) and A.variable_name(var) and _is_constant(bound) \
                        and not isinstance(bound, Infinity):
                    return Union((Interval(Infinity(-1), bound, False, False),
                                  Interval(bound, Infinity(1), False, False)))
        if op != "!=":
            for side, var, bound in (("left", lhs, rhs), ("right", rhs, lhs)):
                if is_label(var) and _is_constant(bound):
                    return _interval_from(side, op, bound)
            solved = _solve_linear(lhs, op, rhs, lim)
            if solved is not None:
                return solved
        if not isinstance(lhs, Scalar) or not isinstance(rhs, Scalar):
            raise Unsupported("inequality between non-numbers")
        return Relation(op, lhs, rhs)
    if len(parts) == 3 and "!=" not in ops:
        lo, mid, hi = parts
        if all(o in _FLIP for o in ops):
            lo, hi, ops = hi, lo, [_FLIP[o] for o in reversed(ops)]
        if all(o in ("<", "<=") for o in ops) and is_label(mid):
            if _is_constant(lo) and _is_constant(hi):
                return Interval(lo, hi, ops[0] == "<=", ops[1] == "<=")
        if all(o in ("<", "<=") for o in ops) and _is_constant(lo) and _is_constant(hi):
            left, right = _solve_linear(lo, ops[0], mid, lim), _solve_linear(mid, ops[1], hi, lim)
            if left is not None and right is not None:  # `-1 < 2x + 1 < 3`: both sides solve for x
                return _intersect(left, right)
    if len(parts) >= 3 and all(isinstance(p, Scalar) for p in parts):
        # an ordering of expressions (`f(2) < f(1) < f(4)`): the chain of its links, compared link by link
        return Tuple(tuple(Relation(*_ordered(op, a, b)) for op, a, b in zip(ops, parts, parts[1:])))
    raise Unsupported("inequality chain")


def _ordered(op: str, a: Scalar, b: Scalar) -> tuple[str, Scalar, Scalar]:
    return (_FLIP[op], b, a) if op in _FLIP else (op, a, b)


def relation_value(parts: list[Value], ops: list[str], lim: Budget) -> Value:
    if "in" in ops:
        first = parts[0]
        if ops == ["in"] and isinstance(first, Scalar) and A.variable_name(first) is not None:
            return parts[1]
        raise Unsupported("membership")
    if all(o == "=" for o in ops):
        return _equations(parts, lim)
    if "=" in ops:
        raise Unsupported("mixed equation and inequality")
    return _inequality(parts, ops, lim)
