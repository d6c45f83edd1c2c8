"""align.verify.extract: the final box, adjacent boxes as one set answer, unclosed boxes, truncation, fallback."""

from __future__ import annotations

from align.verify import extract, extract_answer


def test_final_box_with_nested_braces():
    assert extract_answer(r"so \boxed{\frac{1}{\sqrt{2}}} done") == r"\frac{1}{\sqrt{2}}"
    assert extract_answer(r"first \boxed{1} then \boxed{2}") == "2"


def test_box_variants():
    assert extract_answer(r"\boxed 5.") == "5."
    assert extract_answer(r"$\boxed 12$") == "12"
    assert extract_answer(r"\fbox{7}") == "7"
    assert extract_answer(r"\(\boxed{x}\)") == "x"
    assert extract_answer(r"\boxedx") is None  # a different command, not a box


def test_escaped_braces_are_not_structural():
    assert extract_answer(r"\boxed{\{1, 2\}}") == r"\{1, 2\}"
    assert extract_answer(r"\boxed{\}}") == r"\}"


def test_nested_boxes_count_once():
    found = extract(r"\boxed{\boxed{5}}", 1000)
    assert found.boxes == 1 and found.answer == r"\boxed{5}"


def test_adjacent_boxes_form_a_list():
    for text in (r"\boxed{1}, \boxed{2}", r"$\boxed{1}$ and $\boxed{2}$", r"\boxed{1} or \boxed{2}",
                 r"\boxed{1}\quad\text{or}\quad\boxed{2}", r"\boxed{1}\boxed{2}"):
        assert extract_answer(text) == "1, 2", text
    assert extract_answer(r"\boxed{2} and \boxed{1}") == "2, 1"  # written order: a list is ordered
    assert extract_answer(r"\boxed{3}, \boxed{ 3 }") == "3"  # the same answer twice is one answer
    # Separated by words: only the last box counts.
    assert extract_answer(r"\boxed{1}. Checking again, \boxed{2}") == "2"


def test_missing_empty_and_unclosed_boxes_are_unreadable():
    assert extract_answer("The answer is 5.") is None
    assert extract_answer(r"\boxed{}") is None
    assert extract_answer(r"\boxed{  }") is None
    assert extract_answer(r"The answer is \boxed{5") is None
    assert extract_answer(r"\boxed{1} and \boxed{}") is None  # one empty member spoils the set


def test_ten_thousand_nested_braces_do_not_recurse():
    text = r"\boxed{" + "{" * 10_000 + "5" + "}" * 10_000 + "}"
    assert extract_answer(text) == (
        "{" * 10_000 + "5" + "}" * 10_000)


def test_truncation_keeps_the_tail():
    text = r"\boxed{1}" + "x" * 100 + r"\boxed{2}"
    assert extract(text, 20).answer == "2"
    assert extract(text, 20).boxes == 1
    assert extract(r"\boxed{12345}", 4).answer is None  # the opening of the box was cut away


def test_fallback_is_off_by_default_and_finds_gsm8k_and_answer_is():
    assert extract_answer("The answer is 5.") is None
    assert extract_answer("work\n#### 1,234", fallback=True) == "1,234"
    assert extract_answer("The answer is 5.", fallback=True) == "5"  # the sentence's full stop is not the answer's
    assert extract_answer("Final answer: $\\frac{1}{2}$", fallback=True) == "\\frac{1}{2}"
    found = extract("the answer is 3", 1000, fallback=True)
    assert found.source == "phrase" and found.boxes == 0
    # A box always wins over the fallback.
    assert extract_answer(r"The answer is 5. \boxed{6}", fallback=True) == "6"
