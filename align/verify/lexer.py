"""Tokens of one cleaned answer. One compiled regex, no backtracking between alternatives, ASCII digits only
(Python's `\\d` and `int()` accept other scripts' digits, which would let look-alike text become a number)."""

from __future__ import annotations

import re
from typing import NamedTuple

from align.verify.limits import Budget, OverBudget, Unsupported

_TOKEN = re.compile(
    r"(?P<ws>\s+)"
    r"|(?P<num>[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+(?![a-zA-Z0-9.]))?|\.[0-9]+)"
    r"|(?P<text>\\text\{[^{}]*\})"
    r"|(?P<cmd>\\[a-zA-Z]+|\\[{}|])"
    r"|(?P<word>[a-zA-Z]+)"
    r"|(?P<op><=|>=|!=|\\\\|[-+*/^_=<>!%|,;:()\[\]{}&\u00b0])"
    r"|(?P<bad>.)",
    re.DOTALL,
)

# Function and constant names written without a backslash ("sqrt(2)", "pi").
_BARE_COMMANDS = frozenset({"sin", "cos", "tan", "cot", "sec", "csc", "ln", "log", "exp", "sqrt", "pi", "arcsin",
                            "arccos", "arctan", "infty", "infinity"})


class Token(NamedTuple):
    kind: str  # num | id | cmd | word | text | op | end
    text: str
    space_before: bool  # spaces (no line break) before it


END = Token("end", "", False)


def tokenize(text: str, budget: Budget) -> list[Token]:
    """Split a cleaned answer into tokens; a letter run of 3+ that is no known name becomes one `word`."""
    out: list[Token] = []
    space = False
    for m in _TOKEN.finditer(text):
        kind, value = m.lastgroup, m.group()
        budget.spend()
        if kind == "ws":
            space = "\n" not in value  # a line break separates more than a space does: `11⏎5/6` is no mixed number
            continue
        if kind == "bad":
            raise Unsupported(f"character {value!r}")
        if kind == "num" and len(value) > budget.max_digits:
            raise OverBudget(f"numeric literal over {budget.max_digits} digits")
        if kind == "word":
            if value in _BARE_COMMANDS:
                out.append(Token("cmd", "\\" + value, space))
            elif len(value) <= 2:  # "xy" is x*y
                out.extend(Token("id", ch, space and i == 0) for i, ch in enumerate(value))
            else:
                out.append(Token("word", value.lower(), space))
        elif kind == "text":
            out.append(Token("text", " ".join(value[6:-1].split()).lower(), space))
        else:
            out.append(Token(kind, value, space))
        space = False
    out.append(END)
    return out
