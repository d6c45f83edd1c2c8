"""The equivalence corpus (tests/verify/equiv_corpus.txt, issue 20): are_equivalent(gold, pred) gives every case its
label, raises nothing, and the corpus covers every form with both labels."""

from __future__ import annotations

from pathlib import Path

from verify_corpus import load_corpus

from align.verify import are_equivalent
from align.verify.answer import _read_cached

EQUIV_CORPUS = Path(__file__).with_name("equiv_corpus.txt")
CASES = load_corpus(EQUIV_CORPUS)
FORMS = ("integers and signs", "fraction forms", "roots", "thousands separators", "decimal commas",
         "currency and units", "percentages", "degrees and radians", "plus minus", "named constants",
         "scientific notation", "mixed numbers", "base-n numbers", "matrices and vectors", "intervals",
         "inequalities as solution sets", "equations", "tuples and points", "lists and sets", "text answers",
         "complex numbers", "polynomials and expressions", "MATH-style answers", "whole responses",
         "multilingual responses", "responses on both sides")


def test_size_labels_and_coverage():
    assert len(CASES) >= 800
    assert len({c.case_id for c in CASES}) == len(CASES), "duplicate (gold, pred) pairs"
    assert {c.expected for c in CASES} == {1.0, 0.0}
    for form in FORMS:  # every form with true and false labels
        assert {c.expected for c in CASES if c.category == form} == {1.0, 0.0}, form
    assert sum(c.adversarial for c in CASES) >= 60  # hedges: every one must get no reward


def test_every_case_gets_its_label_and_nothing_raises():
    _read_cached.cache_clear()
    bad = []
    for c in CASES:
        try:
            verdict = are_equivalent(c.gold, c.response)
        except Exception as e:  # noqa: BLE001 - the test is that there are none
            verdict = f"raised {type(e).__name__}: {e}"
        if verdict is not (c.expected == 1.0):
            bad.append(f"line {c.line} [{c.category}]: label {int(c.expected)}, got {verdict}; gold={c.gold!r} "
                       f"pred={c.response!r}")
    assert not bad, "\n".join(bad)
