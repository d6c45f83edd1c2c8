"""Agreement with math_verify (the reference checker, sympy-based) on the whole corpus.

Every disagreement must be listed in oracle_disagreements.txt with a judgment, and the list must be exact: a new
disagreement fails, and so does a listed one that no longer disagrees. "Correct" means reward 1.0 for align and
verify() True for math_verify; align's None (gold unusable) and math_verify's unparseable gold both count as not
correct. Cases where math_verify hits its timeout are reported, not compared (its verdict there depends on load).
The giant/hanging category is `slow`: math_verify spends its whole timeout on most of those inputs.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("math_verify")

from mv_oracle import verdicts  # noqa: E402
from verify_corpus import load_corpus  # noqa: E402

from align.eval.verifier import score  # noqa: E402

pytestmark = pytest.mark.oracle

LISTED_PATH = Path(__file__).with_name("oracle_disagreements.txt")
_LINE = re.compile(r"([0-9a-f]{10}) \| align=([01]) math_verify=([01]) \| (align|design): \S.*")
SLOW_CATEGORY = "giant and hanging inputs"


def _listed() -> dict[str, tuple[int, int]]:
    out = {}
    for number, raw in enumerate(LISTED_PATH.read_text(encoding="utf-8").splitlines(), start=1):
        if not raw.strip() or raw.startswith("#"):
            continue
        m = _LINE.fullmatch(raw)
        assert m, f"{LISTED_PATH.name}:{number}: expected 'ID | align=A math_verify=M | align|design: why'"
        out[m.group(1)] = (int(m.group(2)), int(m.group(3)))
    return out


def _check(cases) -> None:
    listed = _listed()
    found, timed_out = {}, []
    for case, mv in zip(cases, verdicts([(c.gold, c.response) for c in cases])):
        if mv == "T":
            timed_out.append(case.line)
            continue
        ours = int(score(case.response, case.gold).reward == 1.0)
        theirs = int(mv == "1")
        if ours != theirs:
            found[case.case_id] = (ours, theirs, case)
    ids = {c.case_id for c in cases}
    relevant = {k: v for k, v in listed.items() if k in ids and k not in {c.case_id for c in cases
                                                                            if c.line in timed_out}}
    new = [f"{k} | align={a} math_verify={m} | line {c.line}: gold={c.gold!r} response={c.response[-70:]!r}"
           for k, (a, m, c) in found.items() if listed.get(k) != (a, m)]
    stale = [k for k in relevant if k not in found]
    agreement = 1 - len(found) / max(1, len(cases) - len(timed_out))
    print(f"\nagreement {agreement:.4f} on {len(cases) - len(timed_out)} cases; math_verify timed out on lines "
          f"{timed_out}")
    assert not new, "disagreements missing from oracle_disagreements.txt (fix align, or judge them):\n" + "\n".join(new)
    assert not stale, f"listed disagreements that now agree (remove them): {stale}"


def test_every_listed_case_exists():
    ids = {c.case_id for c in load_corpus()}
    assert set(_listed()) <= ids


def test_agreement_with_math_verify():
    _check([c for c in load_corpus() if c.category != SLOW_CATEGORY])


@pytest.mark.slow
def test_agreement_with_math_verify_on_giant_inputs():
    _check([c for c in load_corpus() if c.category == SLOW_CATEGORY])
