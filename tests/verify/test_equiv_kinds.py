"""Issue 46, per kind: on every "## kind: ..." section of tests/verify/equiv_corpus.txt (answers the way real models
and graders write them), align's are_equivalent is right at least as often as math_verify's default
`verify(parse(gold), parse(pred))` (mv_oracle.default_verdict, the real library), and every case has its reason.

The counts are printed (pytest -s) and recorded in docs/MEASUREMENTS.md.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from verify_corpus import load_corpus  # noqa: E402

from align.verify import are_equivalent  # noqa: E402

CORPUS = Path(__file__).with_name("equiv_corpus.txt")
KINDS = ("prose answers", "units, currency, approximations and chains", "numeric vs exact", "symbolic identities",
         "separators", "labelled answers", "several answers", "relations as solution sets", "odd LaTeX",
         "times and sums", "escaping and layout", "false positives")
CASES = [c for c in load_corpus(CORPUS) if c.category.startswith("kind: ")]


def test_every_kind_is_there_with_both_labels_and_reasons():
    assert {c.category[6:] for c in CASES} == set(KINDS)
    for kind in KINDS:
        labels = {c.expected for c in CASES if c.category[6:] == kind}
        assert labels == {0.0, 1.0} or kind == "false positives", kind
    assert all(c.reason for c in CASES), [c.line for c in CASES if not c.reason]


@pytest.mark.oracle
def test_align_is_right_at_least_as_often_as_math_verify_on_every_kind():
    pytest.importorskip("math_verify")
    from mv_oracle import default_verdict, verdicts

    theirs = verdicts([(c.gold, c.response) for c in CASES], default_verdict)
    align_right, mv_right, total = Counter(), Counter(), Counter()
    for case, mv in zip(CASES, theirs):
        label = case.expected == 1.0
        kind = case.category[6:]
        total[kind] += 1
        align_right[kind] += are_equivalent(case.gold, case.response) is label
        mv_right[kind] += (mv == "1") is label
    print()
    for kind in KINDS:
        print(f"{kind:45s} cases {total[kind]:3d}  align right {align_right[kind]:3d}  math_verify right "
              f"{mv_right[kind]:3d}")
    print(f"{'all kinds':45s} cases {sum(total.values()):3d}  align right {sum(align_right.values()):3d}  "
          f"math_verify right {sum(mv_right.values()):3d}")
    behind = [k for k in KINDS if align_right[k] < mv_right[k]]
    assert not behind, f"align behind math_verify on {behind}"
