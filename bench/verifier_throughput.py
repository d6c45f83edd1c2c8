"""Verifier calls/s on 2,000 mixed (gold, response) pairs: align.eval.verifier.score beside math_verify (configured as
TRL's accuracy_reward: gold parsed in `$...$`, completion boxed-first, then verify), same pairs, same process.

The pairs are generated with a known truth (each response is built either equal to its gold in another notation, or
wrong by construction): GRPO-style integer word-problem answers, fractions and decimals, thousands separators,
units and currency, radicals, multiples of pi, intervals, ordered pairs, answer lists, percentages, negative
decimals; each response carries 40-400 characters of reasoning before its box. So the JSON line also reports each
checker's accuracy against the construction truth and their agreement. Rates are given per wall second and per
CPU second of this process (the machine's cores are shared; the CPU-second rates are the steadier comparison).

align runs cold (its memo cleared before the timed pass, so every answer is parsed) and warm (second pass, the GRPO
case where a group shares one gold). math_verify runs in this process's main thread with TRL's timeouts. Also
reported: align's worst single-call latency on the corpus' adversarial cases (tests/verify/corpus.txt), and the
`equiv_*` keys: `are_equivalent` on the equivalence corpus (tests/verify/equiv_corpus.txt, answers and whole
responses on either side) beside math_verify's default `verify(parse(gold), parse(pred))`, with each one's number
of right verdicts against the corpus labels and align's cold per-call latency percentiles (p50, p99, max).

    .venv/bin/python bench/verifier_throughput.py [--pairs 2000] [--seed 0] [--mv-pairs 2000]
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import random
import sys
import time
from fractions import Fraction
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "verify"))  # the corpus loader

from align.eval.verifier import score  # noqa: E402
from align.verify.answer import _read_cached  # noqa: E402

WORDS = "we add the two numbers then multiply by the count and subtract what was given away so the total is".split()


def _reasoning(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 70))) + ".\n"


def _integer(rng):
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    gold = a * b + a
    good = rng.random() < 0.5
    shown = gold if good else gold + rng.choice((-10, -1, 1, 2))
    box = rng.choice(("The answer is \\boxed{%s}.", "$\\boxed{%s}$", "\\boxed{%s}"))
    return str(gold), f"{a} \\times {b} + {a} = {shown}.\n" + box % shown, good


def _fraction(rng):
    q = Fraction(rng.randint(1, 40), rng.randint(2, 40))
    if q.denominator == 1:
        q += Fraction(1, 3)
    p, d = q.numerator, q.denominator
    k = rng.randint(2, 5)
    good = rng.random() < 0.5
    forms = [f"\\frac{{{p}}}{{{d}}}", f"{p}/{d}", f"\\dfrac{{{k * p}}}{{{k * d}}}"]
    if all(f in (2, 5) for f in _factors(d)):
        forms.append(str(p / d) if len(str(p / d)) < 12 else f"{p}/{d}")
    shown = rng.choice(forms) if good else rng.choice((f"\\frac{{{p + 1}}}{{{d}}}", f"\\frac{{{p}}}{{{d + 1}}}"))
    return f"\\frac{{{p}}}{{{d}}}", f"\\boxed{{{shown}}}", good


def _factors(n):
    out, f = [], 2
    while f * f <= n:
        while n % f == 0:
            out.append(f)
            n //= f
        f += 1
    return out + ([n] if n > 1 else [])


def _thousands(rng):
    n = rng.randint(1000, 9_999_999)
    good = rng.random() < 0.5
    shown = n if good else n + rng.choice((-1, 1, 1000))
    return str(n), f"\\boxed{{{shown:,}}}", good


def _units(rng):
    n = rng.randint(1, 500)
    good = rng.random() < 0.5
    shown = n if good else n + 1
    form = rng.choice(("\\${}", "{} \\text{{ dollars}}", "{}\\text{{ cm}}", "{} \\text{{ minutes}}", "{}^\\circ"))
    return str(n), "\\boxed{" + form.format(shown) + "}", good


def _radical(rng):
    k, m = rng.randint(2, 9), rng.choice((2, 3, 5, 6, 7, 10, 11))
    good = rng.random() < 0.5
    shown = f"\\sqrt{{{k * k * m}}}" if good else f"\\sqrt{{{k * k * m + 1}}}"
    return f"{k}\\sqrt{{{m}}}", f"\\boxed{{{shown}}}", good


def _pi(rng):
    k, n = rng.randint(1, 9), rng.randint(2, 9)
    good = rng.random() < 0.5
    shown = f"\\frac{{{k}}}{{{n}}}\\pi" if good else f"\\frac{{{k + 1}}}{{{n}}}\\pi"
    return f"\\frac{{{k}\\pi}}{{{n}}}", f"\\boxed{{{shown}}}", good


def _interval(rng):
    a, b = sorted(rng.sample(range(-20, 20), 2))
    good = rng.random() < 0.5
    return f"({a}, {b}]", f"\\boxed{{({a},{b}]}}" if good else f"\\boxed{{[{a},{b}]}}", good


def _pair(rng):
    a, b = rng.sample(range(-20, 20), 2)
    good = rng.random() < 0.5
    return f"({a}, {b})", f"\\boxed{{({a}, {b})}}" if good else f"\\boxed{{({b}, {a})}}", good


def _list(rng):
    xs = rng.sample(range(-30, 30), 3)
    good = rng.random() < 0.5
    as_set = rng.random() < 0.5  # a set gold accepts any order; a list gold only its own
    shown = (rng.sample(xs, 3) if as_set else xs) if good else xs[:2] + [xs[2] + 1]
    gold = ", ".join(map(str, xs))
    return ("\\{" + gold + "\\}" if as_set else gold), "\\boxed{" + ", ".join(map(str, shown)) + "}", good


def _percent(rng):
    n = rng.randint(1, 99)
    good = rng.random() < 0.5
    return f"{n}\\%", f"\\boxed{{{n if good else n + 1}\\%}}", good


def _negative_decimal(rng):
    q = Fraction(rng.randint(1, 99), rng.choice((2, 4, 5, 10)))
    good = rng.random() < 0.5
    shown = f"-\\frac{{{q.numerator}}}{{{q.denominator}}}" if good else f"{float(q)}"
    return f"-{float(q)}", f"\\boxed{{{shown}}}", good


KINDS = [(_integer, 8), (_fraction, 3), (_thousands, 1), (_units, 1), (_radical, 1), (_pi, 1), (_interval, 1),
         (_pair, 1), (_list, 1), (_percent, 1), (_negative_decimal, 1)]


def make_pairs(n: int, seed: int) -> list[tuple[str, str, bool]]:
    rng = random.Random(seed)
    makers = [m for m, w in KINDS for _ in range(w)]
    out = []
    for _ in range(n):
        gold, response, good = rng.choice(makers)(rng)
        out.append((gold, _reasoning(rng) + response, good))
    return out


def _time_align(pairs) -> tuple[float, float, list[bool]]:
    t0, c0 = time.perf_counter(), time.process_time()
    verdicts = [score(r, g).reward == 1.0 for g, r, _ in pairs]
    return time.perf_counter() - t0, time.process_time() - c0, verdicts


def _time_math_verify(pairs) -> tuple[float, float, list[bool]] | None:
    try:
        from latex2sympy2_extended.latex2sympy2 import NormalizationConfig
        from math_verify import LatexExtractionConfig, parse, verify
    except ImportError:
        return None
    logging.disable(logging.CRITICAL)
    cfg = [LatexExtractionConfig(normalization_config=NormalizationConfig(units=True), boxed_match_priority=0,
                                 try_extract_without_anchor=False)]
    parse("$1$")  # imports and caches warm before timing
    t0, c0 = time.perf_counter(), time.process_time()
    out = []
    for gold, response, _ in pairs:
        g = parse(f"${gold}$", parsing_timeout=10)
        p = parse(response, extraction_config=cfg, extraction_mode="first_match", parsing_timeout=10)
        out.append(bool(g) and verify(g, p, timeout_seconds=5))
    return time.perf_counter() - t0, time.process_time() - c0, out


def _equiv_corpus() -> dict:
    """are_equivalent on tests/verify/equiv_corpus.txt (bare answers, spans, whole and multilingual responses on
    either side) beside math_verify's default verify(parse(gold), parse(pred)), both scored against the labels."""
    from verify_corpus import load_corpus

    from align.verify import are_equivalent

    cases = load_corpus(ROOT / "tests" / "verify" / "equiv_corpus.txt")
    labels = [c.expected == 1.0 for c in cases]
    _read_cached.cache_clear()
    t0, c0 = time.perf_counter(), time.process_time()
    ours, each_ms = [], []
    for c in cases:  # per-call times too: the latency percentiles of a cold call
        t_call = time.perf_counter()
        ours.append(are_equivalent(c.gold, c.response) is True)
        each_ms.append((time.perf_counter() - t_call) * 1000)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    each_ms.sort()
    out = {"equiv_cases": len(cases), "equiv_align_calls_per_s_cold": round(len(cases) / wall),
           "equiv_align_calls_per_cpu_s_cold": round(len(cases) / cpu),
           "equiv_align_right": sum(a == t for a, t in zip(ours, labels)),
           "equiv_align_p50_ms": round(each_ms[len(each_ms) // 2], 3),
           "equiv_align_p99_ms": round(each_ms[int(len(each_ms) * 0.99)], 3),
           "equiv_align_max_ms": round(each_ms[-1], 3)}
    try:
        from math_verify import parse, verify
    except ImportError:
        return out
    logging.disable(logging.CRITICAL)
    t0, c0 = time.perf_counter(), time.process_time()
    theirs = [bool(verify(parse(c.gold, parsing_timeout=10), parse(c.response, parsing_timeout=10), timeout_seconds=5))
              for c in cases]
    mv_wall, mv_cpu = time.perf_counter() - t0, time.process_time() - c0
    out.update({"equiv_math_verify_calls_per_s": round(len(cases) / mv_wall, 1),
                "equiv_math_verify_right": sum(m == t for m, t in zip(theirs, labels)),
                "equiv_speedup_cold": round(mv_wall / wall, 1), "equiv_speedup_cold_cpu": round(mv_cpu / cpu, 1)})
    return out


def _adversarial_worst_ms() -> tuple[float, int]:
    from verify_corpus import load_corpus

    worst, line = 0.0, 0
    for case in load_corpus():
        if not case.adversarial:
            continue
        _read_cached.cache_clear()
        t0 = time.perf_counter()
        score(case.response, case.gold)
        dt = (time.perf_counter() - t0) * 1000
        if dt > worst:
            worst, line = dt, case.line
    return worst, line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mv-pairs", type=int, default=2000, help="how many of the pairs math_verify runs (it is slow)")
    args = ap.parse_args()
    pairs = make_pairs(args.pairs, args.seed)
    truth = [good for _, _, good in pairs]
    _read_cached.cache_clear()
    cold_s, cold_cpu, ours = _time_align(pairs)
    warm_s, _, _ = _time_align(pairs)
    mv = _time_math_verify(pairs[:args.mv_pairs])
    worst_ms, worst_line = _adversarial_worst_ms()
    result = {
        "bench": "verifier_throughput", "pairs": len(pairs), "seed": args.seed,
        "align_calls_per_s_cold": round(len(pairs) / cold_s),
        "align_calls_per_cpu_s_cold": round(len(pairs) / cold_cpu),
        "align_calls_per_s_warm": round(len(pairs) / warm_s),
        "align_accuracy_vs_truth": round(sum(a == t for a, t in zip(ours, truth)) / len(pairs), 4),
        "align_worst_adversarial_ms": round(worst_ms, 2), "align_worst_adversarial_corpus_line": worst_line,
        "python": platform.python_version(), "allocator": "glibc default",
    }
    if mv is not None:
        mv_s, mv_cpu, mv_verdicts = mv
        n = len(mv_verdicts)
        result.update({
            "math_verify_pairs": n, "math_verify_calls_per_s": round(n / mv_s, 1),
            "math_verify_calls_per_cpu_s": round(n / mv_cpu, 1),
            "math_verify_accuracy_vs_truth": round(sum(a == t for a, t in zip(mv_verdicts, truth)) / n, 4),
            "agreement": round(sum(a == b for a, b in zip(ours, mv_verdicts)) / n, 4),
            "speedup_cold": round((len(pairs) / cold_s) / (n / mv_s), 1),
            "speedup_cold_cpu": round((len(pairs) / cold_cpu) / (n / mv_cpu), 1),
        })
    result.update(_equiv_corpus())
    print(json.dumps(result))


if __name__ == "__main__":
    main()
