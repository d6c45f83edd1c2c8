"""Hostile input on the response path of are_equivalent (issue 20): whole texts, math spans, phrases, matrices and
based numbers never raise, give True / False / None, and hedges never pass."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_robustness import PIECES, random_pairs
from verify_corpus import load_corpus

from align.verify import are_equivalent, compare

EQUIV = load_corpus(Path(__file__).with_name("equiv_corpus.txt"))
MORE_PIECES = PIECES + [r"\(", r"\)", r"\[", r"\]", "$$", "The answer is ", "答案是", "Ответ: ", "&", r"\\",
                        r"\begin{pmatrix}", r"\end{pmatrix}", "_5", "_{2}", "^\\circ", "\u00b0", "1 000", "2,5", "٤"]


def test_random_mutations_of_the_equivalence_corpus_never_raise():
    seen = set()
    for gold, pred in random_pairs(20, EQUIV, MORE_PIECES, gold_every=4):
        verdict = are_equivalent(gold, pred)
        assert verdict in (True, False, None), (gold, pred)
        seen.add(verdict)
    assert seen == {True, False, None}


@pytest.mark.parametrize("pred, expected", [
    ("x " * 50_000 + "so the answer is 5", True),  # 100k characters of prose: only the tail is read
    ("The answer is " * 8_000 + "5", True),
    (r"\(" * 30_000 + "5", False),  # openers with no closer: one pass over the delimiters
    ("$" * 99_999 + "5", False),
    ("5 " * 50_000, False),
    (r"\begin{pmatrix}" + " & ".join(["1"] * 5_000) + r"\end{pmatrix}", False),
    (r"\begin{pmatrix}" * 500 + "1" + r"\end{pmatrix}" * 500, False),
    ("1" * 5_000 + "_2", False),
    ("9" * 100_000, False),
    (r"10^{10^{10}} \text{ cm}", False),
])
def test_giant_responses_are_answered_not_hung(pred, expected):
    assert compare("5", pred)[0] is expected


@pytest.mark.parametrize("pred", [
    "It is $5$ or $7$.", r"\boxed{5} \text{ or } \boxed{7}", "5 or 7", "The answer is 5 or 7.", "Ответ: 5 или 7",
    "答案是 5 或 7", "either 5 or 7", r"x > 4", r"5 \pm 2", "5, 7", r"\boxed{5}, \boxed{7}", "La réponse est 5 ou 7.",
])
def test_hedges_never_pass(pred):
    assert are_equivalent("5", pred) is False
