"""Hostile and random input: the verifier never raises, always answers 1.0 / 0.0 / None, works in worker
processes, and stays pure stdlib (no sympy, no eval)."""

from __future__ import annotations

import multiprocessing
import random
import re
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from verify_corpus import load_corpus

from align.eval.verifier import score

ROOT = Path(__file__).resolve().parents[2]
PIECES = [r"\boxed{", "{", "}", r"\frac", r"\sqrt", "^", "_", "(", ")", "[", "]", r"\{", r"\}", ",", "1", "23", "0.5",
          "-", "+", "*", "/", "x", r"\pi", r"\infty", "=", r"\le", "!", "%", r"\text{", "cm", r"\left(", r"\right)",
          "$", " ", "\n", r"\pm", r"\cup", "|", "e", "E", "\u2212", r"\overline{", r"\!", ".", "\\", "'", "or"]


def _mutate(rng: random.Random, text: str) -> str:
    chars = list(text)
    for _ in range(rng.randint(1, 6)):
        op = rng.random()
        at = rng.randint(0, len(chars))
        if op < 0.5:
            chars[at:at] = list(rng.choice(PIECES))
        elif op < 0.8 and chars:
            del chars[min(at, len(chars) - 1)]
        else:
            chars[at:at] = chars[at:at + rng.randint(1, 30)] * rng.randint(1, 20)
    return "".join(chars)


def random_pairs(seed: int, cases: list, pieces: list[str], count: int = 3000, gold_every: int = 5):
    """(gold, response) pairs: every third one soup of `pieces`, the others mutated corpus cases (the gold mutated
    too on every `gold_every`-th)."""
    rng = random.Random(seed)
    for i in range(count):
        if i % 3 == 0:
            response = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 60)))
            yield "".join(rng.choice(pieces) for _ in range(rng.randint(1, 12))), response
        else:
            case = rng.choice(cases)
            yield (_mutate(rng, case.gold) if i % gold_every == 0 else case.gold), _mutate(rng, case.response)


def test_random_mutations_and_soup_never_raise():
    outcomes = set()
    for gold, response in random_pairs(1234, load_corpus(), PIECES):
        result = score(response, gold)
        assert result.reward in (1.0, 0.0, None), (gold, response)
        outcomes.add(result.status)
    assert outcomes == {"correct", "wrong", "unreadable", "gold_unusable"}


def _score_pair(pair):
    return score(pair[1], pair[0]).reward


def test_same_rewards_in_spawned_worker_processes():
    cases = [c for c in load_corpus() if c.adversarial][:80]
    pairs = [(c.gold, c.response) for c in cases]
    with ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn")) as pool:
        rewards = list(pool.map(_score_pair, pairs))
    assert rewards == [c.expected for c in cases]


def test_pure_stdlib_at_import():
    code = ("import sys, align.eval.verifier, align.verify; "
            "print(' '.join(m for m in ('sympy', 'math_verify', 'torch', 'numpy', 'latex2sympy2_extended') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_no_eval_exec_or_foreign_imports_in_source():
    allowed = {"__future__", "dataclasses", "decimal", "fractions", "functools", "math", "re", "typing", "align"}
    for path in [*sorted((ROOT / "align" / "verify").glob("*.py")), ROOT / "align" / "eval" / "verifier.py"]:
        text = path.read_text()
        assert not re.search(r"(?<![.\w])(eval|exec|compile|__import__)\(", text), path  # re.compile is fine
        for module in re.findall(r"^\s*(?:from|import) ([a-zA-Z_]+)", text, re.M):
            assert module in allowed, f"{path.name} imports {module}"
