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
    (r"\frac13", "0.333333", True),  # issue 46: VerifyConfig.decimal_min_sig_digits (off in REWARD_CONFIG)
    ("0.500", r"\frac12", True), ("2.0", "2", True),
    ("-0.333", r"-\frac{1}{3}", True), ("-0.333", r"\frac{1}{3}", False),
])
def test_rounded_gold_tolerance(gold, pred, expected):
    assert are_equivalent(gold, pred) is expected


@pytest.mark.parametrize("gold, pred, expected", [
    (r"\frac13", "0.3333", True), (r"\frac23", "0.6667", True), (r"\frac23", "0.6666", True),  # rounded, truncated
    (r"\frac13", "0.333", False), (r"\frac13", "0.3334", False),  # under 4 significant digits; neither
    (r"\sqrt{10}", "3.1622776601683795", True), (r"\sqrt{10}", "3.16229", False),  # a double's repr
    (r"\frac18", "0.13", False), (r"\frac18", "0.1250", True),  # a terminating gold needs its value
    (r"\pi", "3.1416", True), (r"\pi", "3.1417", False), (r"\frac{\sqrt3}{2}", "0.8660", True),
])
def test_decimal_prediction_of_an_exact_gold(gold, pred, expected):
    assert are_equivalent(gold, pred) is expected


def test_decimal_prediction_tolerance_is_configurable_and_off_for_the_reward():
    from align.eval.verifier import score
    from align.verify.config import REWARD_CONFIG

    assert REWARD_CONFIG.decimal_min_sig_digits == 0
    assert are_equivalent(r"\frac13", "0.3333", REWARD_CONFIG) is False
    assert score(r"\boxed{0.3333}", r"\frac13").reward == 0.0
    assert score(r"\boxed{0.3333}", r"\frac13", VerifyConfig()).reward == 1.0
    assert are_equivalent(r"\frac13", "0.33", VerifyConfig(decimal_min_sig_digits=2)) is True


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


DOCUMENTED = [  # the examples of align/verify/__init__.py's docstring, each form it says it reads
    ("1000", "1 000"), ("1000", r"1\,000"), ("10000", "10{,}000"), ("1.22", "1,22"), ("2.5", "La réponse est 2,5"),
    ("42", "\u0664\u0662"), ("42", "\u096a\u0968"), (r"\frac{1}{2}", r"\dfrac12"), (r"0.\overline{3}", r"\frac13"),
    (r"9999 \frac{6}{7}", r"\frac{69999}{7}"), ("2.5", "2 1/2"), (r"2\sqrt2", r"\sqrt{8}"),
    (r"\sqrt[3]{x}^2", "x^{2/3}"), (r"\frac{\sqrt2}{2}", r"\frac{1}{\sqrt2}"), (r"\frac{\pi}{4}", r"\pi/4"),
    (r"1.5 \times 10^{3}", "1.5e3"), (r"25\%", r"\frac14"), ("18", "18 \u20ac"), ("18", r"\$18"),
    ("12", "12 m\u00b2"), ("12", r"12\text{ cm}^2"), (r"30^\circ", r"\frac{\pi}{6}"), (r"\frac{\pi}{6}", r"30^\circ"),
    ("204_5", "204_{5}"), ("204_5", "204"),
    (r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}", r"\begin{array}{cc} 1 & 2 \\ 3 & 4 \end{array}"),
    (r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", "(1, 2)"), (r"(-\infty, 3]", r"x \le 3"), ("[-2, 7]", r"x \in [-2, 7]"),
    ("[-2, 7]", r"-2 \le x \le 7"), (r"(-\infty,-1) \cup (2,\infty)", r"x < -1 \text{ or } x > 2"),
    ("x < 1", "-x > -1"), (r"2x + 1 \le 7", r"x \le 3"), (r"-1 \le 2x+1 < 3", "[-1, 1)"), ("y = 2x + 1", "2x + 1"),
    ("y = 2x + 1", "2y = 4x + 2"), ("y = 2x + 1", "1 + 2x = y"), ("f(x) = 3x", "3x"), (r"\{10, 4, -2\}", "4, 10, -2"),
    (r"1 \pm \sqrt2", r"1-\sqrt2, 1+\sqrt2"), (r"\emptyset", r"\varnothing"), ("(1, 2)", r"\langle 1, 2 \rangle"),
    (r"\text{Evelyn}", r"\textbf{evelyn}"), (r"\text{(C)}", "C"), ("2i", "(1+i)^2"), ("2i", r"\sqrt{-4}"),
    ("5", "|3+4i|"), ("5", "(2+i)(2-i)"), ("x^2+7x+10", "(x+2)(x+5)"), (r"\frac{x+1}{x^2-1}", r"\frac{1}{x-1}"),
    (r"\mathbb{R}", r"\text{all real numbers}"), (r"(-\infty, 2]", r"(-\infty, 1) \cup [1, 2]"),
    (r"(-\infty,-2)\cup(-2,\infty)", r"x \ne -2"), (r"\sqrt{x}^3", r"x\sqrt{x}"), ("12", r"12^\circ C"),
]


@pytest.mark.parametrize("gold, pred", DOCUMENTED)
def test_documented_forms_are_read(gold, pred):
    assert are_equivalent(gold, pred) is True


@pytest.mark.parametrize("gold, pred, cfg", [
    ("10, 4, -2", "4, 10, -2", VerifyConfig()), (r"\frac{\pi}{6}", "30", VerifyConfig()),
    ("204_5", "54", VerifyConfig()),
    (r"5\text{ cm}", "5 m", VerifyConfig(units="match")), (r"5\text{ cm}", "5", VerifyConfig(units="match")),
    ("y = 2x + 1", "2x + 1", VerifyConfig(assignment_is_value=False)), ("5", "\U0001d7d3", VerifyConfig()),
    ("5", r"4 \text{ thousand}", VerifyConfig()), ("5", r"5 \text{ maybe}", VerifyConfig()),
])
def test_documented_refusals(gold, pred, cfg):
    assert are_equivalent(gold, pred, cfg) is False


def test_switches_turn_the_leniencies_on():
    assert are_equivalent("10, 4, -2", "4, 10, -2", VerifyConfig(unordered_lists=True)) is True
    assert are_equivalent(r"5\text{ cm}", r"5 \text{ centimeters}", VerifyConfig(units="match")) is True


def test_every_eval_set_states_its_numeric_tolerance_in_its_receipt():
    import dataclasses

    from align.data.evalsets import EVALSETS, get_evalset

    for name in EVALSETS.names():
        settings = dataclasses.asdict(get_evalset(name).verify)  # what ingest_evalset writes to the manifest
        assert settings["decimal_min_sig_digits"] == 4, name


@pytest.mark.parametrize("pred", [
    r"x = 5 \approx 7", r"$x \approx 5$ or $7$", "5; 7", r"\boxed{5; 7}", "5:7", "The answer is not 7 but 5 or 6.",
    "Final Answer: 5 or 7", "which is 5 or 7€", r"\sum_{k=5}^{7} 1", "|x| = 5", "x = 5, y = 7", "(a,b) = (5,7)",
    "5, 7, ...", "so it is 5 or maybe 7", "It is between 5 and 7.", r"x = 7 = 5", "<think>5</think>The answer is 7.",
])
def test_issue_46_forms_reward_no_hedge(pred):
    # the forms issue 46 added (approximations, `;` lists, ratios, labels, stated numbers, sums, think blocks)
    # never turn two candidate answers, or a set of them, into the one gold
    assert are_equivalent("5", pred) is False
