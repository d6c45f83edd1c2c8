"""align against math_verify on the equivalence corpus (issue 20): both scored against the labels, math_verify called
as a new user calls it (`verify(parse(gold), parse(pred))`, every default; mv_oracle.default_verdict).

align must be right on more cases than math_verify and raise nothing, and every case where the two disagree must be
listed in docs/MEASUREMENTS.md (between the equiv-oracle markers) with which one is right; the list must be exact.
Rewrite the list after a deliberate change with:  .venv/bin/python tests/verify/test_equiv_oracle.py --write
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
pytest.importorskip("math_verify")

from mv_oracle import default_verdict, verdicts  # noqa: E402
from verify_corpus import load_corpus  # noqa: E402

from align.verify import are_equivalent  # noqa: E402

pytestmark = pytest.mark.oracle

CORPUS = Path(__file__).with_name("equiv_corpus.txt")
MEASUREMENTS = Path(__file__).resolve().parents[2] / "docs" / "MEASUREMENTS.md"
BEGIN, END = "<!-- equiv-oracle:begin -->", "<!-- equiv-oracle:end -->"
_ROW = re.compile(r"\| `([0-9a-f]{10})` \| [0-9]+ \| .* \| (align|math_verify) \|")


def _align(case) -> str:
    try:
        return "1" if are_equivalent(case.gold, case.response) else "0"
    except Exception as e:  # noqa: BLE001 - counted: there must be none
        return f"E {type(e).__name__}: {e}"


_PICTURES = {c: 0x2400 + c for c in range(32) if c != 10}  # control characters as their pictures (␌ for \f)


def _cell(text: str) -> str:
    text = text.replace("⏎", " ").replace("\n", "⏎").translate(_PICTURES)
    return "`" + text.replace("|", "\\|").replace("`", "'")[:90] + "`"


def run() -> tuple[list, list[str], list[str]]:
    cases = load_corpus(CORPUS)
    ours = [_align(c) for c in cases]
    theirs = verdicts([(c.gold, c.response) for c in cases], default_verdict)
    return cases, ours, theirs


def table(cases, ours, theirs) -> list[str]:
    rows = ["| case | line | category | gold | pred | label | align | math_verify | right |",
            "|---|---|---|---|---|---|---|---|---|"]
    for c, a, m in zip(cases, ours, theirs):
        if a != m and m != "T":  # a math_verify timeout is reported, not compared (its verdict depends on load)
            label = "1" if c.expected == 1.0 else "0"
            right = "align" if a == label else "math_verify"
            rows.append(f"| `{c.case_id}` | {c.line} | {c.category} | {_cell(c.gold)} | {_cell(c.response)} | {label} "
                        f"| {a} | {m} | {right} |")
    return rows


def _listed() -> dict[str, str]:
    text = MEASUREMENTS.read_text(encoding="utf-8")
    body = text[text.index(BEGIN) + len(BEGIN):text.index(END)]
    return {m.group(1): m.group(2) for m in map(_ROW.match, body.splitlines()) if m}


def test_align_beats_math_verify_and_every_disagreement_is_listed():
    cases, ours, theirs = run()
    label = ["1" if c.expected == 1.0 else "0" for c in cases]
    align_right = sum(a == t for a, t in zip(ours, label))
    mv_right = sum(m == t for m, t in zip(theirs, label))
    raised = [c.line for c, a in zip(cases, ours) if a.startswith("E")]
    print(f"\nequivalence corpus, {len(cases)} cases: align right on {align_right}, math_verify right on {mv_right} "
          f"(math_verify raised on {theirs.count('E')}, timed out on {theirs.count('T')})")
    assert not raised, f"align raised on corpus lines {raised}"
    assert align_right > mv_right
    actual = {_ROW.match(r).group(1): _ROW.match(r).group(2) for r in table(cases, ours, theirs)[2:]}
    listed = _listed()
    missing = {k: v for k, v in actual.items() if listed.get(k) != v}
    timed_out = {c.case_id for c, m in zip(cases, theirs) if m == "T"}
    stale = sorted(set(listed) - set(actual) - timed_out)
    assert not missing and not stale, (f"docs/MEASUREMENTS.md disagreement list is out of date ({len(missing)} missing "
                                       f"or changed, stale {stale}); rewrite: python {Path(__file__).name} --write")


def write() -> None:
    cases, ours, theirs = run()
    text = MEASUREMENTS.read_text(encoding="utf-8")
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    MEASUREMENTS.write_text(head + BEGIN + "\n" + "\n".join(table(cases, ours, theirs)) + "\n" + END + tail,
                            encoding="utf-8")


if __name__ == "__main__" and "--write" in sys.argv:
    write()
