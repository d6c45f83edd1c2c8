"""align.verify.normalize.clean: what is stripped (and what deliberately is not)."""

from __future__ import annotations

import pytest

from align.verify.normalize import clean


@pytest.mark.parametrize("raw, cleaned", [
    ("1,000", "1000"),
    ("1,234,567", "1234567"),
    ("1{,}000", "1000"),
    (r"1\,000", "1000"),
    ("(1,234)", "(1,234)"),  # inside brackets a comma separates items
    ("1,2345", "1,2345"),  # not a thousands grouping: a list
    ("\u22125", "-5"),
    ("\uff15", "5"),
    (r"\$18", "18"),
    ("18 dollars", "18"),
    (r"12\text{ m}^2", "12"),
    (r"5\mbox{ cm}", "5"),
    (r"5 \mathrm{~km}", "5"),
    (r"12 \text{ cookies}", "12"),
    ("3 apples", "3"),
    (r"30^\circ", "30\u00b0"),  # a final degree sign is kept: the answer is an angle in degrees
    (r"30^{\circ}", "30\u00b0"),
    ("30\u00b0", "30\u00b0"),
    ("1 000 000", "1000000"),
    ("1,22", "1.22"),  # two digits after a comma: a decimal comma
    ("2{,}5", "2.5"),
    ("\u0664\u0662", "42"),
    (r"\left( 1, 2 \right]", "( 1, 2 ]"),
    (r"\left.\frac{1}{2}\right.", r"\frac{1}{2}"),
    (r"\dfrac{1}{2}", r"\frac{1}{2}"),
    (r"\tbinom{5}{2}", r"\binom{5}{2}"),
    (r"25\%", "25%"),
    ("25 percent", "25%"),
    ("5.", "5"),
    (r"\text{(B)}", "(B)"),
    (r"\text{7 cm}", "7"),
    (r"0.\overline{3}", r"\frac{3}{9}"),
    (r"0.1\overline{6}", r"\frac{15}{90}"),
    (r"\sin 45^\circ", r"\sin {(45\pi/180)}"),
])
def test_clean(raw, cleaned):
    assert clean(raw) == cleaned


@pytest.mark.parametrize("raw", [
    r"5 \text{ or } 7",  # becomes a list, never a scalar
    r"4 \text{ thousand}",  # a number word changes the value: kept, so unreadable
    r"5 \text{ maybe}",
    r"5\text{ (not 6)}",
])
def test_words_that_change_or_hedge_the_value_are_kept(raw):
    out = clean(raw)
    assert out != "5" and out != "4", out


def test_text_that_is_math_is_read_as_math():
    assert clean(r"\text{5}") == "5"
    assert clean(r"\mathrm{d}x") == "d x"
