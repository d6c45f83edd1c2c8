"""A recursive-descent parser that evaluates one answer to an exact Value. Never `eval`, never sympy.

Grammar (loosest first): list `a, b` > `\\cup` > relation `= < \\le \\in` > sum `+ - \\pm` > product `* / \\cdot`
and juxtaposition > unary sign > power `^` (one level: `2^3^2` is a TeX error, refused) > postfix `! %` > atom.
Recursion passes through `primary` at every nesting level, which counts depth against VerifyConfig.max_depth, so
10,000 nested braces end in OverBudget, not RecursionError. Every token taken pays one step into the Budget.
"""

from __future__ import annotations

from fractions import Fraction

from align.verify import algebra as A
from align.verify import functions as F
from align.verify.algebra import Scalar
from align.verify.lexer import Token
from align.verify.limits import Budget, OverBudget, Unsupported
from align.verify.structures import bracket_value, relation_value, union_value
from align.verify.sums import finite_or_closed_sum
from align.verify.values import Based, FiniteSet, Infinity, Interval, List, Matrix, Ratio, Time, Tuple, Value

PI = A.symbol("pi")
REALS = Interval(Infinity(-1), Infinity(1), False, False)
GREEK = frozenset("\\" + g for g in (
    "alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu xi omicron rho "
    "sigma tau upsilon phi varphi chi psi omega Gamma Delta Theta Lambda Xi Sigma Upsilon Phi Psi Omega").split())
_RELOPS = {"=": "=", "<": "<", ">": ">", "<=": "<=", ">=": ">=", "!=": "!=", "\\le": "<=", "\\leq": "<=",
           "\\leqslant": "<=", "\\ge": ">=", "\\geq": ">=", "\\geqslant": ">=", "\\lt": "<", "\\gt": ">",
           "\\ne": "!=", "\\neq": "!=", "\\in": "in"}
_TIMES = frozenset({"\\cdot", "\\times", "\\ast"})
# Commands that may follow a factor with no operator between ("2\\pi", "3\\sqrt{2}", "x\\sin x").
_IMPLICIT_CMDS = frozenset({"\\pi", "\\sqrt", "\\frac", "\\binom", "\\lfloor", "\\lceil"}) | GREEK | F.FUNCTIONS
_CLOSERS = {"(": ")", "[": "]", "{": "}"}
_MATRIX_ENVS = frozenset({"matrix", "pmatrix", "bmatrix", "smallmatrix", "array", "cases"})


def as_scalar(v: Value) -> Scalar:
    if isinstance(v, Scalar):
        return v
    if isinstance(v, Based):  # `204_5 + 1`: inside arithmetic a based number is its value
        return v.value
    raise Unsupported(f"arithmetic on {type(v).__name__}")


def matrix_add(a: Matrix, b: Matrix, sign: int, lim: Budget) -> Matrix:
    if len(a.rows) != len(b.rows) or len(a.rows[0]) != len(b.rows[0]):
        raise Unsupported("matrices of different shapes")
    return Matrix(tuple(tuple(A.add(as_scalar(x), as_scalar(y), lim, sign) for x, y in zip(ra, rb))
                        for ra, rb in zip(a.rows, b.rows)))


def matrix_mul(a: Value, b: Value, lim: Budget) -> Matrix:
    """A matrix product, or a number times a matrix."""
    if not isinstance(a, Matrix):
        return Matrix(tuple(tuple(A.mul(as_scalar(a), as_scalar(x), lim) for x in r) for r in b.rows))
    if not isinstance(b, Matrix):
        return matrix_mul(b, a, lim)
    if len(a.rows[0]) != len(b.rows):
        raise Unsupported("matrix shapes do not multiply")
    lim.spend(len(a.rows) * len(b.rows[0]) * len(b.rows))
    out = []
    for row in a.rows:
        cells = []
        for j in range(len(b.rows[0])):
            cell = A.const(0)
            for k, x in enumerate(row):
                cell = A.add(cell, A.mul(as_scalar(x), as_scalar(b.rows[k][j]), lim), lim)
            cells.append(cell)
        out.append(tuple(cells))
    return Matrix(tuple(out))


def lift(op, a: Value, b: Value) -> Value:
    """op(a, b) on Scalars; over a `\\pm` set it applies to each element (at most 8)."""
    if isinstance(a, FiniteSet) and a.from_pm or isinstance(b, FiniteSet) and b.from_pm:
        xs = a.items if isinstance(a, FiniteSet) else (a,)
        ys = b.items if isinstance(b, FiniteSet) else (b,)
        if len(xs) * len(ys) > 8:
            raise OverBudget("too many \\pm")
        return FiniteSet(tuple(op(as_scalar(x), as_scalar(y)) for x in xs for y in ys), from_pm=True)
    return op(as_scalar(a), as_scalar(b))


def literal(text: str, lim: Budget) -> Scalar:
    """A numeric literal, exactly: "0.1" is 1/10; "1.5e3" is 1500 (exponent size checked before computing)."""
    mantissa, _, exponent = text.lower().partition("e")
    value = Fraction(mantissa)
    if exponent:
        e = int(exponent)
        if abs(e) * 10 > lim.max_bits * 3:
            raise OverBudget("exponent too large")
        value *= Fraction(10) ** e
    lit = mantissa if "." in mantissa and not exponent else None
    return Scalar({A.ONE_MONO: value} if value else {}, None, lit)


class Parser:
    def __init__(self, tokens: list[Token], budget: Budget, max_depth: int) -> None:
        self.toks = tokens
        self.i = 0
        self.b = budget
        self.depth = 0
        self.max_depth = max_depth
        self.bound: dict[str, str] = {}  # a sum's index variable -> its anonymous name (`\\sum_{k=1}^n k`)

    def _mul(self, a: Scalar, b: Scalar) -> Scalar:
        return A.mul(a, b, self.b)

    def _product(self, a: Value, b: Value) -> Value:
        if isinstance(a, Matrix) or isinstance(b, Matrix):
            return matrix_mul(a, b, self.b)
        return lift(self._mul, a, b)

    def _div(self, a: Scalar, b: Scalar) -> Scalar:
        return A.div(a, b, self.b)

    # -- token helpers
    def peek(self) -> Token:
        return self.toks[self.i]

    def take(self) -> Token:
        t = self.toks[self.i]
        if t.kind != "end":
            self.i += 1
        self.b.spend()
        return t

    def is_op(self, text: str) -> bool:
        t = self.toks[self.i]
        return t.kind == "op" and t.text == text

    def is_cmd(self, *names: str) -> bool:
        t = self.toks[self.i]
        return t.kind == "cmd" and t.text in names

    def expect(self, kind: str, text: str) -> None:
        t = self.take()
        if t.kind != kind or t.text != text:
            raise Unsupported(f"expected {text!r}, found {t.text or 'end of answer'!r}")

    # -- levels, loosest first
    def parse(self) -> Value:
        groups = [self.items()]
        while self.is_op(";"):  # `1; 2; 3` is a list; `p=3,q=2;p=5,q=2` a list of tuples
            self.take()
            groups.append(self.items())
        if self.peek().kind != "end":
            raise Unsupported(f"unexpected {self.peek().text!r}")
        if len(groups) > 1:
            return List(tuple(g[0] if len(g) == 1 else Tuple(tuple(g)) for g in groups))
        items = groups[0]
        return items[0] if len(items) == 1 else List(tuple(items))

    def items(self) -> list[Value]:
        out = [self.item()]
        while self.is_op(","):
            self.take()
            out.append(self.item())
        return out

    def item(self) -> Value:
        v = self.relation()
        while self.is_cmd("\\cup"):
            self.take()
            v = union_value(v, self.relation())
        return v

    def relation(self) -> Value:
        parts, ops = [self.clock() or self.ratio(self.function_name() or self.additive())], []
        while True:
            t = self.peek()
            op = _RELOPS.get(t.text) if t.kind in ("op", "cmd") else None
            if op is None:
                break
            self.take()
            ops.append(op)
            parts.append(self.clock() or self.ratio(self.additive()))
        return relation_value(parts, ops, self.b) if ops else parts[0]

    def clock(self) -> Time | None:
        """`10:30`, `10:30:00`: hours of one or two digits, then two-digit minutes (and seconds) under 60."""
        t = self.toks[self.i:self.i + 5]
        if not (len(t) >= 4 and t[0].kind == "num" and t[0].text.isdigit() and len(t[0].text) <= 2
                and t[1].text == ":" and t[2].kind == "num" and len(t[2].text) == 2 and t[2].text.isdigit()
                and int(t[2].text) < 60):
            return None
        seconds, used = int(t[0].text) * 3600 + int(t[2].text) * 60, 3
        if (len(t) == 5 and t[3].text == ":" and t[4].kind == "num" and len(t[4].text) == 2 and t[4].text.isdigit()
                and int(t[4].text) < 60):
            seconds, used = seconds + int(t[4].text), 5
        if self.toks[self.i + used].text == ":":
            return None
        self.i += used
        self.b.spend(used)
        return Time(seconds)

    def ratio(self, first: Value) -> Value:
        """`5:9`, `S_1:S_2`: parts separated by colons."""
        if not self.is_op(":"):
            return first
        parts = [first]
        while self.is_op(":"):
            self.take()
            parts.append(self.additive())
        return Ratio(tuple(parts))

    def function_name(self) -> Scalar | None:
        """`f(x) = 3x`: a one-letter function of one variable left of `=` names the answer like a variable."""
        t = self.toks[self.i:self.i + 5]
        if (len(t) == 5 and t[0].kind == "id" and t[1].text == "(" and t[2].kind in ("id", "num")
                and t[3].text == ")" and t[4].kind == "op" and t[4].text == "="):
            self.i += 4
            self.b.spend(4)
            return A.symbol(f"v:{t[0].text}({t[2].text})")
        return None

    def additive(self) -> Value:
        plus_minus = self.is_cmd("\\pm", "\\mp")
        if plus_minus:
            self.take()
            first = as_scalar(self.term())
            vals = [first, A.neg(first)]
        else:
            vals = [self.term()]
        while True:
            t = self.peek()
            if t.kind == "op" and t.text in "+-":
                self.take()
                term = self.term()
                if isinstance(term, Matrix) and len(vals) == 1 and isinstance(vals[0], Matrix):
                    vals = [matrix_add(vals[0], term, 1 if t.text == "+" else -1, self.b)]
                    continue
                w = as_scalar(term)
                vals = [A.add(as_scalar(x), w, self.b, 1 if t.text == "+" else -1) for x in vals]
            elif t.kind == "cmd" and t.text in ("\\pm", "\\mp"):
                self.take()
                plus_minus = True
                w = as_scalar(self.term())
                vals = [A.add(as_scalar(x), w, self.b, s) for x in vals for s in (1, -1)]
                if len(vals) > 8:
                    raise OverBudget("too many \\pm")
            else:
                break
        return FiniteSet(tuple(vals), from_pm=True) if plus_minus else vals[0]

    def term(self) -> Value:
        v = self.unary()
        while True:
            t = self.peek()
            if (t.kind == "op" and t.text == "*") or (t.kind == "cmd" and t.text in _TIMES):
                self.take()
                v = self._product(v, self.unary())
            elif (t.kind == "op" and t.text == "/") or (t.kind == "cmd" and t.text == "\\div"):
                self.take()
                v = lift(self._div, v, self.unary())
            elif t.kind == "id" or (t.kind == "cmd" and t.text in _IMPLICIT_CMDS) or (t.kind == "op" and t.text == "("):
                v = lift(self._mul, v, self.power())
            elif t.kind == "cmd" and t.text == "\\begin":  # a matrix product written side by side
                v = self._product(v, self.power())
            elif t.kind == "num" and self.toks[self.i + 1].text == "^" and self.toks[self.i - 1].text in "}0123456789":
                v = lift(self._mul, v, self.power())  # `2^6 3^5`: powers side by side are a product
            elif t.kind == "num":
                raise Unsupported("two numbers side by side")
            else:
                return v

    def unary(self) -> Value:
        negative = False
        while self.peek().kind == "op" and self.peek().text in "+-":
            negative ^= self.take().text == "-"
        v = self.power()
        if not negative:
            return v
        if isinstance(v, Infinity):
            return Infinity(-v.sign)
        return A.neg(as_scalar(v))

    def power(self) -> Value:
        base = self.postfix()
        if not self.is_op("^"):
            return base
        self.take()
        negative = False
        while self.peek().kind == "op" and self.peek().text in "+-":  # "10^-3" as people type it
            negative ^= self.take().text == "-"
        exponent = as_scalar(self.primary())
        if self.is_op("^"):
            raise Unsupported("double superscript")
        return A.power(as_scalar(base), A.neg(exponent) if negative else exponent, self.b)

    def postfix(self) -> Value:
        v = self.primary(mixed=True)
        while True:
            if self.is_op("!"):
                self.take()
                v = F.factorial(as_scalar(v), self.b)
            elif self.is_op("%"):
                self.take()
                v = A.div(as_scalar(v), A.const(100), self.b)
            elif self.is_op("\u00b0"):  # a degree sign inside an answer (`30°, 60°`) is dropped; at the end, answer.py
                self.take()
            else:
                return v

    def primary(self, mixed: bool = False) -> Value:
        """One atom; `mixed` allows a mixed number (not in an exponent or a macro argument: `x^2\\frac12`)."""
        self.depth += 1
        if self.depth > self.max_depth:
            raise OverBudget(f"nesting deeper than {self.max_depth}")
        t = self.take()
        if t.kind == "num" and self.is_op("_") and t.text.isdigit():
            v = self.based(t.text)
        elif t.kind == "num":
            v = self.number(t) if mixed else literal(t.text, self.b)
        elif t.kind == "id":
            name = "v:" + t.text + self.subscript()
            v = A.symbol(self.bound.get(name, name))
        elif t.kind == "cmd":
            v = self.command(t.text)
        elif t.kind == "op" and t.text in _CLOSERS:
            v = self.group(t.text)
        elif t.kind == "op" and t.text == "|":
            v = F.absolute(as_scalar(self.additive()), self.b)
            self.expect("op", "|")
        else:
            raise Unsupported(f"unexpected {t.text or 'end of answer'!r}")
        self.depth -= 1
        return v

    # -- atoms
    def number(self, t: Token) -> Scalar:
        v = literal(t.text, self.b)
        if not t.text.isdigit():
            return v
        j, toks = self.i, self.toks
        # Mixed numbers: "2\frac{1}{2}" and "2 1/2" are 5/2 (the MATH convention), not 2 * 1/2.
        if toks[j].kind == "cmd" and toks[j].text == "\\frac":
            shape = [x.kind + ":" + x.text for x in toks[j + 1:j + 7]]
            if (len(shape) == 6 and shape[0] == shape[3] == "op:{" and shape[2] == shape[5] == "op:}"
                    and toks[j + 2].text.isdigit() and toks[j + 5].text.isdigit()):
                self.i = j + 7
                return A.add(v, A.const(Fraction(int(toks[j + 2].text), int(toks[j + 5].text))), self.b)
            if toks[j + 1].kind == "num" and len(toks[j + 1].text) == 2 and toks[j + 1].text.isdigit():
                self.i = j + 2
                return A.add(v, A.const(Fraction(int(toks[j + 1].text[0]), int(toks[j + 1].text[1]))), self.b)
        if (toks[j].kind == "num" and toks[j].space_before and toks[j].text.isdigit()
                and toks[j + 1].kind == "op" and toks[j + 1].text == "/" and toks[j + 2].kind == "num"
                and toks[j + 2].text.isdigit() and int(toks[j].text) < int(toks[j + 2].text)):
            self.i = j + 3
            return A.add(v, A.const(Fraction(int(toks[j].text), int(toks[j + 2].text))), self.b)
        return v

    def based(self, digits: str) -> Based:
        """`204_5`, `4210_{5}`: digits in a base from 2 to 36 given as a decimal subscript."""
        self.take()
        braced = self.is_op("{")
        if braced:
            self.take()
        t = self.take()
        if t.kind != "num" or not t.text.isdigit() or not 2 <= int(t.text) <= 36:
            raise Unsupported("base subscript must be an integer from 2 to 36")
        if braced:
            self.expect("op", "}")
        base = int(t.text)
        if any(int(d) >= base for d in digits):
            raise Unsupported(f"digit out of range in base {base}")
        return Based(digits, base, A.const(int(digits, base)))

    def matrix(self) -> Matrix:
        """`\\begin{pmatrix} a & b \\\\ c & d \\end{pmatrix}` (also bmatrix, vmatrix-free kinds, `array` with a
        column spec): rows split at `\\\\`, entries at `&`; every row the same length."""
        self.expect("op", "{")
        env = self.take()
        if env.kind != "word" or env.text not in _MATRIX_ENVS:
            raise Unsupported(f"environment {env.text!r}")
        self.expect("op", "}")
        if env.text == "array" and self.is_op("{"):  # the column spec `{cc}` / `{c|c}`
            while not self.is_op("}"):
                if self.take().kind == "end":
                    raise Unsupported("unclosed array column spec")
            self.take()
        rows, row = [], []
        while True:
            if self.is_cmd("\\end"):
                break
            row.append(self.relation())
            if self.is_op("&"):
                self.take()
            elif self.is_op("\\\\"):
                self.take()
                rows.append(tuple(row))
                row = []
            elif not self.is_cmd("\\end"):
                raise Unsupported(f"unexpected {self.peek().text or 'end of answer'!r} in a matrix")
        if row:
            rows.append(tuple(row))
        self.take()
        self.expect("op", "{")
        if self.take().text != env.text:
            raise Unsupported("\\begin and \\end do not match")
        self.expect("op", "}")
        if not rows or len({len(r) for r in rows}) != 1:
            raise Unsupported("matrix rows of different lengths")
        return Matrix(tuple(rows))

    def subscript(self) -> str:
        if not self.is_op("_"):
            return ""
        self.take()
        t = self.take()
        if t.kind in ("num", "id"):
            return "_" + t.text
        if t.kind == "op" and t.text == "{":
            parts = []
            while not self.is_op("}"):
                inner = self.take()
                if inner.kind not in ("num", "id", "op") or inner.text in "{}":
                    raise Unsupported("complex subscript")
                parts.append(inner.text)
            self.take()
            return "_{" + "".join(parts) + "}"
        raise Unsupported("subscript")

    def group(self, opener: str) -> Value:
        closer = _CLOSERS[opener]
        if self.is_op(closer):
            raise Unsupported(f"empty {opener}{closer}")
        items = self.items()
        end = self.take()
        if end.kind != "op" or end.text not in ")]}":
            raise Unsupported(f"unclosed {opener!r}")
        if opener == "{":
            if end.text != "}":
                raise Unsupported("'{' closed by " + end.text)
            return items[0] if len(items) == 1 else FiniteSet(tuple(items))
        return bracket_value(opener, end.text, items)

    def arg(self) -> Value:
        """One TeX macro argument: a braced group, or one character/token (`\\frac12` is 1/2)."""
        t = self.peek()
        if t.kind == "num" and len(t.text) > 1 and t.text[0].isdigit():
            self.b.spend()
            self.toks[self.i] = Token("num", t.text[1:], False)
            return A.const(int(t.text[0]))
        if t.kind == "end":
            raise Unsupported("missing argument")
        return self.primary()

    def listed(self, closer: str) -> list[Value]:
        """Items up to the command `closer` (`\\}`, `\\rangle`); may be empty."""
        if self.is_cmd(closer):
            self.take()
            return []
        out = self.items()
        self.expect("cmd", closer)
        return out

    def command(self, name: str) -> Value:
        b = self.b
        if name == "\\frac":
            num = self.arg()
            return lift(self._div, num, self.arg())
        if name == "\\sqrt":
            k = 2
            if self.is_op("["):
                self.take()
                q = as_scalar(self.additive()).rational()
                self.expect("op", "]")
                if q is None or q.denominator != 1:
                    raise Unsupported("root index")
                k = q.numerator
            return A.root(as_scalar(self.arg()), k, b)
        if name == "\\pi":
            return PI
        if name in ("\\infty", "\\infinity", "\\inf"):
            return Infinity(1)
        if name in GREEK:
            return A.symbol("v:" + name + self.subscript())
        if name == "\\binom":
            n = as_scalar(self.arg())
            return F.binomial(n, as_scalar(self.arg()), b)
        if name in F.FUNCTIONS:
            return self.function(name)
        if name == "\\{":
            return FiniteSet(tuple(self.listed("\\}")))
        if name in ("\\emptyset", "\\varnothing"):
            return FiniteSet(())
        if name == "\\langle":
            return Tuple(tuple(self.listed("\\rangle")))
        if name in ("\\boxed", "\\fbox"):
            return self.arg()
        if name == "\\begin":
            return self.matrix()
        if name == "\\sum":
            return self.summation()
        if name == "\\mathbb":  # \mathbb{R}: the whole real line
            t = self.arg()
            if not (isinstance(t, Scalar) and A.variable_name(t) == "R"):
                raise Unsupported("\\mathbb of anything but R")
            return REALS
        closers = {"\\lfloor": "\\rfloor", "\\lceil": "\\rceil", "\\lvert": "\\rvert", "\\vert": "\\vert"}
        if name in closers:
            v = as_scalar(self.additive())
            self.expect("cmd", closers[name])
            if name in ("\\lvert", "\\vert"):
                return F.absolute(v, self.b)
            return F.rounding(name[2:], v)
        raise Unsupported(f"command {name}")

    def summation(self) -> Scalar:
        """`\\sum_{k=lo}^{hi} body`: the body is one product term; the index is renamed, so the letter is free."""
        self.expect("op", "_")
        self.expect("op", "{")
        index = self.take()
        if index.kind != "id":
            raise Unsupported("sum index")
        name = "v:" + index.text + self.subscript()
        self.expect("op", "=")
        lo = as_scalar(self.additive())
        self.expect("op", "}")
        self.expect("op", "^")
        hi = as_scalar(self.arg())
        anonymous = f"v:#{len(self.bound)}"
        saved = self.bound.get(name)
        self.bound[name] = anonymous
        body = as_scalar(self.term())
        if saved is None:
            del self.bound[name]
        else:
            self.bound[name] = saved
        return finite_or_closed_sum(anonymous, lo, hi, body, self.b)

    def function(self, name: str) -> Scalar:
        base = None
        if name == "\\log" and self.is_op("_"):
            self.take()
            base = as_scalar(self.arg())
        outer = None
        if self.is_op("^"):  # \sin^2 x
            self.take()
            outer = as_scalar(self.primary())
        t = self.peek()
        x = as_scalar(self.primary() if t.kind == "op" and t.text in "({" else self.power())
        if name in F.TRIG:
            v = F.trig(name, x, self.b)
        elif name == "\\exp":
            v = A.power(A.symbol("v:e"), x, self.b)
        elif name in ("\\log", "\\ln", "\\lg"):
            v = F.logarithm(base, x, name, self.b)
        else:
            v = A.opaque(name[1:], x)
        return v if outer is None else A.power(v, outer, self.b)
