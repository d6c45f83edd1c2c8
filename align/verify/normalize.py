"""String-level clean-up of one extracted answer, before tokenising: unicode look-alikes, spacing commands,
`\\left`/`\\right`, fraction variants, degrees, currency, units, thousands separators, trailing punctuation.

Units are removed only from a fixed list (and a unit's `^2`/`^3` with it): a `\\text{...}` that is not a unit stays
and makes the answer unreadable inside an expression, which is what stops `5 \\text{ or } 7` from passing as 5.
"""

from __future__ import annotations

import re

# Phrases, comma-separated. Matched whole and case-insensitively against `\\text{...}` contents.
_UNIT_PHRASES = """
mm, cm, m, km, meter, meters, metre, metres, centimeter, centimeters, millimeter, millimeters, kilometer,
kilometers, in, inch, inches, ft, foot, feet, yd, yard, yards, mi, mile, miles,
unit, units, sq units, square units, square unit, cubic units, cubic unit, sq ft, sq m, sq cm, sq in, sq km,
square feet, square foot, square meters, square metres, square inches, square inch, square centimeters,
square kilometers, square miles, cubic feet, cubic inches, cubic meters, cubic centimeters, cc,
l, ml, liter, liters, litre, litres, gallon, gallons, quart, quarts, pint, pints, cup, cups,
g, mg, kg, gram, grams, kilogram, kilograms, milligram, milligrams, lb, lbs, pound, pounds, oz, ounce, ounces,
ton, tons, s, sec, secs, second, seconds, min, mins, minute, minutes, h, hr, hrs, hour, hours, day, days,
week, weeks, month, months, year, years, yr, yrs,
mph, kph, km/h, km/hr, m/s, ft/s, miles per hour, kilometers per hour, meters per second,
dollar, dollars, cent, cents, usd, euro, euros, degree, degrees, deg, radian, radians, rad
"""
UNITS = frozenset(p.strip() for p in _UNIT_PHRASES.replace("\n", " ").split(",") if p.strip())
# Bare (unmarked) units after a number: only unambiguous words of 2+ letters ("in", "m", "s" could be variables).
_BARE_UNITS = sorted((u for u in UNITS if len(u) >= 2 and u not in {"in", "mi", "cc", "rad", "deg"}),
                     key=len, reverse=True)

# A trailing noun after a number ("12 \\text{ cookies}") is dropped like a unit, unless it is one of these words,
# which can change the value or hedge ("4 thousand", "3 or", "5 maybe", "2 squared").
_NOT_A_NOUN = frozenset("""
or and not no nor either neither maybe perhaps possibly probably approximately approx about roughly around nearly
almost least most more less than only except but plus minus times over divided squared cubed percent hundred
hundreds thousand thousands million millions billion billions trillion dozen dozens score half halves third thirds
quarter quarters twice double triple wrong incorrect correct true false none all each per undefined infinity
infinite impossible unknown answer solution is are was were
""".split())
_TRAILING_WORDS = re.compile(r"(?<=[0-9})\]])\s*(?:\\text\{([a-z][a-z -]{0,40})\}|\s([a-zA-Z][a-zA-Z -]{0,40}))\s*$")

_UNICODE = str.maketrans({
    "\u2212": "-", "\u2013": "-", "\u2014": "-", "\u2010": "-", "\u2012": "-", "\ufe63": "-", "\uff0d": "-",
    "\u00d7": r"\times ", "\u00b7": r"\cdot ", "\u22c5": r"\cdot ", "\u00f7": r"\div ", "\u221a": r"\sqrt ",
    "\u03c0": r"\pi ", "\u221e": r"\infty ", "\u2264": r"\le ", "\u2265": r"\ge ",
    "\u2260": r"\ne ", "\u00b1": r"\pm ", "\u222a": r"\cup ", "\u2205": r"\emptyset ", "\u00b2": "^2",
    "\u00b3": "^3", "\u2248": r"\approx ",
    "\u00a0": " ", "\u2009": " ", "\u202f": " ", "\u2007": " ", "\u200b": "", "\uff0c": ",",
    "\uff08": "(", "\uff09": ")", "\u2215": "/", "\uff05": "%",
    "\u066b": ".", "\u066c": ",", "\u060c": ",", "\u20ac": "", "\u00a3": "", "\u00a5": "", "\u20b9": "", "\u20bd": "",
    **{chr(0xFF10 + d): str(d) for d in range(10)},
    # Arabic-Indic, Persian and Devanagari digits: what Arabic, Persian and Hindi model outputs write.
    **{chr(base + d): str(d) for base in (0x0660, 0x06F0, 0x0966) for d in range(10)},
})
_DEGREE_MARK = "\u00b0"  # kept through clean(): a final degree sign makes the answer an angle in degrees

_TEXT_CMD = re.compile(
    r"\\(text|textbf|textit|textrm|textsf|texttt|textnormal|mbox|hbox|mathrm|mathbf|mathit|mathsf|mathtt|"
    r"mathnormal|operatorname|rm|bf)\s*\{([^{}]*)\}(\s*\^\s*\{?\s*[23]\s*\}?)?")
_MATHY = re.compile(r"[0-9a-zA-Z\s.,+\-*/()\[\]^=<>|]*")
_WORD2 = re.compile(r"[a-zA-Z]{2,}")
_SIZING = re.compile(r"\\(?:left|right)\s*\.|"
                     r"\\(?:left|right|[bB]igg?[lrm]?|displaystyle|textstyle|scriptstyle|limits|nolimits)(?![a-zA-Z])")
_THIN_THOUSANDS = re.compile(r"(?<=[0-9])(?:,\s*\\!\s*|\\[,!;:]\s*|\{,\}|\\ )+(?=[0-9]{3}(?![0-9]))")
_BRACED_COMMA = re.compile(r"(?<=[0-9])\{,\}(?=[0-9])")  # `2{,}5` (LaTeX decimal comma) once `10{,}000` is done
_NEG_SPACE = re.compile(r"\\!")
# Harmless wrappers around math: the macro goes, its braced argument stays a group (`\mathbf{\frac12}` is `{\frac12}`);
# a colour or an explicit space goes whole.
_WRAPPER = re.compile(r"\\(?:mathbf|boldsymbol|bm|pmb|underline|ensuremath|mathrm|mathit|mathsf|mathnormal|textbf|"
                      r"textrm|textnormal)\s*(?=\{)|\\(?:textcolor|color)\s*\{[a-zA-Z!0-9]*\}|"
                      r"\\(?:[hv]space\*?|phantom|hphantom|vphantom)\s*\{[^{}]*\}|"
                      r"\\(?:tiny|small|normalsize|large|Large|LARGE|huge|Huge|mathstrut|strut)(?![a-zA-Z])")
# `a \approx b`: the exact part and its approximation (answer.py keeps the exact part when the two agree);
# `p \Rightarrow q`: the conclusion. Words that end a derivation in the answer itself.
APPROX = "\\approx"
_IMPLIES = re.compile(r"\\(?:Rightarrow|implies|Longrightarrow|therefore)(?![a-zA-Z])")
# A word label before `=`: `\text{Area} = 6` is 6.
_WORD_LABEL = re.compile(r"^\s*\\(?:text|mathrm|textbf|operatorname)\s*\{\s*[A-Za-z][A-Za-z ]{0,30}\}\s*=(?![=<>])")
# Control characters a Python string made from LaTeX holds ("\frac" written without r"": form feed + "rac").
_CONTROL = re.compile(r"[\x07\x08\x0b\x0c]|[\t\r](?=[a-z]{2})")
_CONTROL_AS = {"\x07": "\\a", "\x08": "\\b", "\x0b": "\\v", "\x0c": "\\f", "\t": "\\t", "\r": "\\r"}
# A command written with a doubled backslash, as a JSON dump leaves it (`\\frac`): one backslash. Only before a
# command name, and never where a third backslash makes it a line break followed by a command.
_OVER_ESCAPED = re.compile(
    r"(?<!\\)\\(?=\\(?:boxed|fbox|frac|dfrac|tfrac|sqrt|text|mathrm|mathbf|pi|cdot|times|div|left|right|le|ge|leq|geq|"
    r"neq|ne|infty|pm|mp|circ|begin|end|cup|cap|in|sin|cos|tan|cot|sec|csc|log|ln|exp|approx|dots|ldots|quad|qquad|"
    r"alpha|beta|gamma|theta|lambda|mu|sigma|omega|binom|dbinom|emptyset|varnothing|mathbb|overline|sum|\(|\)|\[|\]|"
    r"\$|\{|\})(?![a-zA-Z]))")
_SPACES = re.compile(r"(?<!\\)\\[,;: ]|\\(?:quad|qquad|enspace|thinspace|medspace|thickspace)(?![a-zA-Z])|~")
_FRAC = re.compile(r"\\[dtc]frac(?![a-zA-Z])")
_BINOM = re.compile(r"\\[dt]binom(?![a-zA-Z])")
_DEGREE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\circ(?![a-zA-Z])|\\degree(?![a-zA-Z])|\^\s*\{\s*o\s*\}|\^\s*\u00b0")
# Degrees Celsius / Fahrenheit are a unit around a temperature, not an angle.
_TEMPERATURE = re.compile(r"(?:\^\s*\{?\s*\\circ\s*\}?|\u00b0)\s*(?:\\(?:text|mathrm)\s*\{\s*[CF]\s*\}|[CF])(?![a-zA-Z])")
_BARE_DEGREES = re.compile(r"(?<=[0-9}])\s*(?:degrees?|deg)\s*$")
_UNIT_SQUARED = re.compile(r"(?<=[0-9 ])(mm|cm|km|m|ft|in)([\u00b2\u00b3])")
_SPACE_THOUSANDS = re.compile(r"(?<![0-9.,])[0-9]{1,3}(?: [0-9]{3})+(?![0-9./])")
_DECIMAL_COMMA = re.compile(r"-?[0-9]+,[0-9]{2}|-?0,[0-9]+")  # `1,22`, `0,125`: no thousands grouping looks so
_POINT_THOUSANDS = re.compile(r"-?[0-9]{1,3}(?:\.[0-9]{3})+,[0-9]+")  # `1.234,5`: thousands points, decimal comma
_TRAILING_BREAK = re.compile(r"\\[\s\\]*$")  # a line break `\\` or a stray backslash after the answer
_TRIG = re.compile(r"\\(?:sin|cos|tan|cot|sec|csc)(?![a-zA-Z])")
_TRIG_DEGREE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*(?:\^\s*\{?\s*\\circ\s*\}?|\\degree(?![a-zA-Z])|\u00b0)")
_DOUBLE_COMMA = re.compile(r",(?:\s*,)+")
_AND_OR = re.compile(r"(?<!\s)\s+(?:and|or)\s+")
_MATH_DELIMS = re.compile(r"\\\$|\$|(?<!\\)\\[()\[\]]")
_PERCENT = re.compile(r"\\%|(?<!\s)\s*\bpercent\b|\\percent(?![a-zA-Z])")
_TRAIL = " \t\n\r.,;:?"
_THOUSANDS = re.compile(r"(?<![0-9.,])[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])(?!,[0-9])")
_REPEATING = re.compile(r"(?<![0-9])([0-9]*)\.([0-9]*)\\overline\s*\{([0-9]{1,30})\}")
_BARE_UNIT = re.compile(
    r"(?:(?<=[0-9})])|(?<=\\pi))\s*(?:" + "|".join(re.escape(u) for u in _BARE_UNITS)
    + r")(?![a-zA-Z])(?:\s*\^\s*\{?\s*[23]\s*\}?)?\s*$")


def _text_command(m: re.Match) -> str:
    body = " ".join(m.group(2).replace("~", " ").split())
    low = body.lower().rstrip(".")
    power = m.group(3) or ""
    if low in ("degree", "degrees", "deg"):
        return _DEGREE_MARK
    if not low or low in UNITS:
        return " "
    if low in ("and", "or", ","):
        # "x = 1 \text{ or } x = 2" lists solutions; a list never equals a scalar gold, so hedging gains nothing.
        return ", "
    body = _BARE_UNIT.sub("", body)  # "\text{7 cm}"
    if _MATHY.fullmatch(body) and not _WORD2.search(body):
        # `\text{5}`, `\mathrm{d}`, `\text{(B)}`: math written in a text font; read it as math.
        return f" {body}{power} "
    return f" \\text{{{low}}}{power} "


def _repeating(m: re.Match) -> str:
    """0.1\\overline{6} -> \\frac{15}{90}: the repeating decimal's exact value."""
    whole, fixed, rep = m.group(1) or "0", m.group(2), m.group(3)
    num = int(whole + fixed + rep) - int(whole + fixed)
    return f"\\frac{{{num}}}{{{10 ** len(fixed) * (10 ** len(rep) - 1)}}}"


def _trailing_words(m: re.Match) -> str:
    words = (m.group(1) or m.group(2)).lower().replace("-", " ").split()
    if 1 <= len(words) <= 3 and all(len(w) >= 2 and w not in _NOT_A_NOUN for w in words):
        return ""
    return m.group(0)


_TWELVE_HOUR = re.compile(r"^([0-9]{1,2}):([0-9]{2})\s*(?:\\(?:text|mathrm)\s*\{\s*)?([AaPp])\.?\s*[Mm]\.?\s*\}?$")


def _clock_24(m: re.Match) -> str:
    """`08:34 P.M.` is 20:34: a clock time on 24 hours (hours 1 to 12 only)."""
    hours = int(m.group(1))
    if not 1 <= hours <= 12:
        return m.group(0)
    hours = hours % 12 + (12 if m.group(3) in "Pp" else 0)
    return f"{hours}:{m.group(2)}"


def repair_escapes(text: str) -> str:
    """Undo two accidents of how answers travel: control characters where `\\f`, `\\t`, `\\b` met a Python string,
    and doubled backslashes before a command where a JSON dump escaped them."""
    if _CONTROL.search(text):
        text = _CONTROL.sub(lambda m: _CONTROL_AS[m.group()], text)
    if "\\\\" in text:
        text = _OVER_ESCAPED.sub("", text)
    return text


def clean(answer: str) -> str:
    """Return the answer as plain tokenisable LaTeX-ish text (see the module docstring for what is removed)."""
    s = _UNIT_SQUARED.sub(lambda m: "\\text{%s}^%d" % (m.group(1), 2 if m.group(2) == "\u00b2" else 3), answer)
    s = repair_escapes(s).translate(_UNICODE).replace("~", " ")
    if ":" in s and ("M" in s or "m" in s):
        s = _TWELVE_HOUR.sub(_clock_24, s.strip())
    if "C" in s or "F" in s:
        s = _TEMPERATURE.sub(" ", s)
    if "\\" in s or "{" in s:
        s = _THIN_THOUSANDS.sub("", s)
        s = _BRACED_COMMA.sub(".", s)
        if "\\R" in s or "\\i" in s or "\\L" in s or "\\t" in s:
            s = _IMPLIES.split(s)[-1]
        s = _WORD_LABEL.sub("", s)
        for _ in range(2):  # a unit inside a text command (`\\text{5 \\text{cm}}`) is removed first
            s = _TEXT_CMD.sub(_text_command, s)
        s = _WRAPPER.sub(" ", s)
        s = _SIZING.sub("", s)
        s = _NEG_SPACE.sub("", s)
        s = _SPACES.sub(" ", s)
        s = _FRAC.sub(r"\\frac", s)
        s = _BINOM.sub(r"\\binom", s)
        if _TRIG.search(s):  # sin 45^\circ: degrees become radians inside trigonometry
            s = _TRIG_DEGREE.sub(r"{(\1\\pi/180)}", s)
        s = _DEGREE.sub(_DEGREE_MARK, s)
        s = _REPEATING.sub(_repeating, s)
    s = _MATH_DELIMS.sub("", s)
    s = _AND_OR.sub(", ", s)
    if "," in s:
        s = _DOUBLE_COMMA.sub(",", s)  # "19, 46, and 82": the Oxford comma before "and"
    s = _PERCENT.sub("%", s)
    if s.rstrip().endswith(("...", "\u2026")):  # `1, 2, 3, ...`: the list goes on; never the finite list
        return s.rstrip().rstrip(".\u2026") + "\\ldots"
    s = _TRAILING_BREAK.sub("", s.strip().rstrip(_TRAIL)).rstrip(_TRAIL)
    s = _BARE_DEGREES.sub(_DEGREE_MARK, s)
    s = _BARE_UNIT.sub("", s).rstrip()
    s = _TRAILING_WORDS.sub(_trailing_words, s).rstrip()
    if " " in s:
        s = _SPACE_THOUSANDS.sub(lambda m: m.group(0).replace(" ", ""), s)
    if "," in s and not any(c in s for c in "([{"):
        if _DECIMAL_COMMA.fullmatch(s):
            return s.replace(",", ".")
        if _POINT_THOUSANDS.fullmatch(s):
            return s.replace(".", "").replace(",", ".")
        s = _THOUSANDS.sub(lambda m: m.group(0).replace(",", ""), s)
    return s.rstrip(_TRAIL).strip()
