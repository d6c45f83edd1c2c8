"""Loader for tests/verify/corpus.txt (format in that file's header). Shared by the corpus test, the oracle test
and bench/verifier_throughput.py."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

CORPUS_PATH = Path(__file__).with_name("corpus.txt")
_REPEAT = re.compile(r"«(.*?)×([0-9]+)»", re.DOTALL)
_EXPECTED = {"1": 1.0, "0": 0.0, "N": None}


@dataclass(frozen=True)
class Case:
    case_id: str  # stable: a hash of the gold and the raw response, so editing other lines does not renumber
    line: int
    category: str
    adversarial: bool
    expected: float | None
    gold: str
    response: str
    reason: str = ""  # why the label is what it is (the optional fourth field)


# Control characters a Python string made from LaTeX holds where a backslash met an escape (`"\frac"` is form feed +
# "rac"), written as their Unicode control pictures so the corpus file stays plain text.
_CONTROL = str.maketrans({"⏎": "\n", "␌": "\f", "␉": "\t", "␈": "\b", "␇": "\a", "␋": "\v", "␍": "\r"})


def expand(field: str) -> str:
    return _REPEAT.sub(lambda m: m.group(1) * int(m.group(2)), field.strip()).translate(_CONTROL)


def load_corpus(path: Path = CORPUS_PATH) -> list[Case]:
    cases, category, adversarial = [], "", False
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if raw.startswith("## "):
            name = raw[3:].strip()
            adversarial = name.endswith("!")
            category = name.rstrip("!").strip()
            continue
        if not raw.strip() or raw.startswith("#"):
            continue
        parts = raw.split("|||")
        if len(parts) not in (3, 4) or parts[0].strip() not in _EXPECTED:
            raise ValueError(f"{path}:{number}: expected 'EXPECTED ||| GOLD ||| RESPONSE [||| REASON]', got "
                             f"{raw[:80]!r}")
        key = hashlib.sha256((parts[1].strip() + "\x00" + parts[2].strip()).encode()).hexdigest()[:10]
        cases.append(Case(key, number, category, adversarial, _EXPECTED[parts[0].strip()], expand(parts[1]),
                          expand(parts[2]), parts[3].strip() if len(parts) == 4 else ""))
    return cases
