"""align.verify.are_equivalent / is_readable: the comparison rules and their documented leniencies."""

from __future__ import annotations

import pytest

from align.verify import VerifyConfig, are_equivalent, compare, is_readable, why_unreadable


def test_contract_values():
    assert are_equivalent("5", "5") is True
    assert are_equivalent("5", "6") is False
    assert are_equivalent("5", r"\frac{") is False  # unreadable prediction: wrong, not an error
    assert are_equivalent(r"\frac{", "5") is None  # unreadable gold: no verdict, never True
    assert are_equivalent("", "") is None


def test_boxed_answers_are_unboxed():
    assert are_equivalent(r"\boxed{5}", r"so \boxed{5}.") is True
    assert are_equivalent("1, 2", r"\boxed{1}, \boxed{2}") is True
    assert are_equivalent("1, 2", r"\boxed{2}, \boxed{1}") is False  # a list is ordered unless the gold is a set
    assert are_equivalent(r"\{1, 2\}", r"\boxed{2}, \boxed{1}") is True
    assert are_equivalent("1, 2", r"\boxed{2}, \boxed{1}", VerifyConfig(unordered_lists=True)) is True


def test_is_readable():
    assert is_readable(r"\frac{1}{2}") and is_readable("(1, 2]") and is_readable(r"\text{yes}")
    assert not is_readable("") and not is_readable(r"\frac{1}{") and not is_readable(r"10^{10^{10}}")
    assert why_unreadable(r"10^{10^{10}}").startswith("OverBudget")
    assert why_unreadable("2^3^2").startswith("Unsupported")


@pytest.mark.parametrize("gold, pred, expected", [
    ("0.333", r"\frac13", True), ("0.33", r"\frac13", False),  # >= 3 significant digits to count as rounded
    ("3.14", r"\pi", True), ("3.141", r"\pi", False), ("3.14", "3.1416", False),  # terminating preds are exact
    (r"\frac13", "0.333333", False),  # the tolerance follows the gold only
    ("0.500", r"\frac12", True), ("2.0", "2", True),
    ("-0.333", r"-\frac{1}{3}", True), ("-0.333", r"\frac{1}{3}", False),
])
def test_rounded_gold_tolerance(gold, pred, expected):
    assert are_equivalent(gold, pred) is expected


def test_rounded_gold_tolerance_can_be_turned_off():
    assert are_equivalent("0.333", r"\frac13", VerifyConfig(rounded_gold_min_sig_digits=0)) is False
    assert are_equivalent("0.33", r"\frac13", VerifyConfig(rounded_gold_min_sig_digits=2)) is True


@pytest.mark.parametrize("mode, pred, expected", [
    ("either", "25", True), ("either", "0.25", True), ("fraction", "25", False), ("fraction", "0.25", True),
    ("number", "25", True), ("number", "0.25", False),
])
def test_percent_modes(mode, pred, expected):
    cfg = VerifyConfig(percent=mode)
    assert are_equivalent(r"25\%", pred, cfg) is expected
    assert are_equivalent(pred, r"25\%", cfg) is expected


def test_sets_tuples_intervals():
    assert are_equivalent(r"\{1,2,3\}", "3, 1, 2") is True
    assert are_equivalent("(1,2,3)", "(3,2,1)") is False
    assert are_equivalent("(1,2)", "(1,2)") is True and are_equivalent("(1,2)", "[1,2)") is False
    assert are_equivalent("(1,2)", r"\langle 1, 2\rangle") is True
    assert are_equivalent("(1, -1)", "1, -1") is False  # an unordered list is not an ordered pair
    assert are_equivalent("3", r"\{3\}") is True and are_equivalent("3", r"\{3, 4\}") is False
    assert are_equivalent(r"(-\infty, 0) \cup (1, \infty)", r"x > 1 \cup x < 0") is True  # relations as sets
    assert are_equivalent(r"(-\infty, 0) \cup (1, \infty)", r"(1, \infty) \cup (-\infty, 0)") is True


def test_relations():
    assert are_equivalent("x = 5", "5") is True and are_equivalent("5", "y = 5") is True
    assert are_equivalent("x = 5", "y = 5") is False  # both assignments: the variable matters
    assert are_equivalent("x^2 + y^2 = 1", "1 = y^2 + x^2") is True
    assert are_equivalent(r"x \ne 2", r"2 \neq x") is True
    assert are_equivalent(r"(-\infty, 3]", r"x \le 3") is True
    assert are_equivalent(r"(-\infty, 3]", r"x < 3") is False


def test_compare_says_why():
    assert compare("5", "6") == (False, "different")
    verdict, why = compare("5", r"\frac{")
    assert verdict is False and why.startswith("prediction unreadable (Unsupported")
