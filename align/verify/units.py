"""The unit an answer is written in, for VerifyConfig.units = "match": currency signs, `\\text{...}` units from the
normalizer's list, bare unit words after a number, `%` and degree signs. Spellings of one unit share one name
(`\\text{ cm}`, `centimeters` -> "cm"); units are never converted (`5 m` does not match `500 cm`)."""

from __future__ import annotations

import re

from align.verify.normalize import UNITS

_SAME = {  # spelling -> the unit's one name
    **dict.fromkeys(("$", "\\$", "dollar", "dollars", "usd"), "usd"), **dict.fromkeys(("€", "euro", "euros"), "eur"),
    **dict.fromkeys(("£", "pound sterling"), "gbp"), **dict.fromkeys(("%", "\\%", "percent"), "%"),
    **dict.fromkeys(("°", "\\circ", "degree", "degrees", "deg"), "deg"),
    **dict.fromkeys(("cm", "centimeter", "centimeters", "centimetre", "centimetres"), "cm"),
    **dict.fromkeys(("m", "meter", "meters", "metre", "metres"), "m"),
    **dict.fromkeys(("mm", "millimeter", "millimeters"), "mm"),
    **dict.fromkeys(("km", "kilometer", "kilometers"), "km"),
    **dict.fromkeys(("in", "inch", "inches"), "in"), **dict.fromkeys(("ft", "foot", "feet"), "ft"),
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), "s"), **dict.fromkeys(("min", "mins", "minute",
                                                                                      "minutes"), "min"),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), "h"), **dict.fromkeys(("g", "gram", "grams"), "g"),
    **dict.fromkeys(("kg", "kilogram", "kilograms"), "kg"), **dict.fromkeys(("l", "liter", "liters", "litre",
                                                                           "litres"), "l"),
}
_MARKED = re.compile(r"\\(?:text|mathrm|mbox|textrm|operatorname)\s*\{\s*([^{}]{1,40}?)\s*\}(\s*\^\s*\{?\s*[23])?")
_SIGNS = re.compile(r"\\\$|\$|€|£|\\%|%|°|\\circ(?![a-zA-Z])")
_BARE = re.compile(r"(?<=[0-9}])\s*([a-zA-Z][a-zA-Z ]{0,30}?)\s*(\^\s*\{?\s*[23]|[²³])?\s*$")


def _name(word: str, power: str | None) -> str:
    base = _SAME.get(word.lower().strip(), word.lower().strip())
    digit = next((c for c in (power or "") if c in "23²³"), "")
    return base + {"": "", "2": "^2", "²": "^2", "3": "^3", "³": "^3"}[digit]


def unit_of(answer: str) -> str:
    """The unit of one answer ("" when it has none): its first marked unit, else its sign, else a bare unit word."""
    for m in _MARKED.finditer(answer):
        if m.group(1).lower() in UNITS:
            return _name(m.group(1), m.group(2))
    sign = _SIGNS.search(answer)
    if sign:
        return _name(sign.group(), None)
    bare = _BARE.search(answer)
    if bare and bare.group(1).lower().strip() in UNITS:
        return _name(bare.group(1), bare.group(2))
    return ""
