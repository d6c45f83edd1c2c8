"""The corpus (tests/verify/corpus.txt): every case's reward from align.eval.verifier.score matches the design's
expected value. One test per property so a failure lists every offending line at once."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from verify_corpus import load_corpus

from align.eval.verifier import score
from align.verify.answer import _read_cached

CASES = load_corpus()


def _mismatches(results):
    return [f"line {c.line} [{c.category}]: expected {c.expected}, got {r.reward} ({r.reason}); gold={c.gold[:60]!r} "
            f"response=...{c.response[-60:]!r}" for c, r in zip(CASES, results) if r.reward != c.expected]


def test_corpus_size_and_coverage():
    assert len(CASES) >= 400
    assert sum(c.adversarial for c in CASES) >= 60
    assert len({c.case_id for c in CASES}) == len(CASES), "duplicate (gold, response) pairs in corpus.txt"
    expected = {c.expected for c in CASES}
    assert expected == {1.0, 0.0, None}
    categories = {c.category for c in CASES}
    for needed in ("extraction", "integers and signs", "decimals and fractions", "percentages", "intervals",
                   "tuples and points", "sets and lists", "roots, pi and exact forms", "scientific notation",
                   "units, text and degrees", "rounded gold", "gold unusable", "giant and hanging inputs"):
        assert needed in categories


def test_corpus_expected_rewards():
    _read_cached.cache_clear()  # cold: every answer parsed from scratch
    bad = _mismatches([score(c.response, c.gold) for c in CASES])
    assert not bad, "\n".join(bad)


def test_corpus_same_rewards_warm_cache_and_in_threads():
    # The memo must not change a verdict, and no part of the verifier may depend on running in the main thread
    # (math_verify's signal.alarm does).
    cold = [score(c.response, c.gold) for c in CASES]
    with ThreadPoolExecutor(max_workers=2) as pool:
        threaded = list(pool.map(lambda c: score(c.response, c.gold), CASES))
    assert [r.reward for r in threaded] == [r.reward for r in cold]
    assert not _mismatches(threaded)


def test_rewards_are_only_one_zero_or_none():
    assert {score(c.response, c.gold).reward for c in CASES} <= {1.0, 0.0, None}
