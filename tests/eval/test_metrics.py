"""align.eval.metrics: pass@k against its definition (enumerating every k-subset), and the aggregate metrics."""

from __future__ import annotations

from fractions import Fraction
from itertools import combinations

import pytest

from align.eval.metrics import Judged, greedy_metrics, pass_at_k, sampled_metrics


def pass_at_k_by_enumeration(n: int, c: int, k: int) -> Fraction:
    """The definition: the fraction of k-subsets of the n samples (c of them correct) holding a correct one."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(combinations(range(n), k))
    return Fraction(sum(any(samples[i] for i in s) for s in subsets), len(subsets))


def test_pass_at_k_equals_the_definition():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(float(pass_at_k_by_enumeration(n, c, k)), abs=1e-12)


def test_pass_at_1_is_the_fraction_correct_and_large_n_does_not_overflow():
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(1000, 1, 500) == pytest.approx(0.5)
    assert 0.0 < pass_at_k(2000, 1, 1) < 1.0


@pytest.mark.parametrize("n,c,k", [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)])
def test_pass_at_k_refuses_impossible_counts(n, c, k):
    with pytest.raises(ValueError, match="pass_at_k"):
        pass_at_k(n, c, k)


def _j(row, reward, group="1", fmt=True, tokens=10, truncated=False):
    return Judged(row, group, reward, fmt, tokens, truncated)


def test_greedy_metrics_leave_unusable_golds_out_of_accuracy():
    samples = [_j(0, 1.0), _j(1, 0.0, "2", fmt=False, tokens=64, truncated=True), _j(2, None, "2"), _j(3, 1.0, "2")]
    m = greedy_metrics(samples)
    assert m["accuracy"] == pytest.approx(2 / 3)
    assert m["gold_unusable"] == 1 and m["examples"] == 4
    assert m["format_rate"] == pytest.approx(3 / 4)
    assert m["truncation_rate"] == pytest.approx(1 / 4)
    assert m["mean_length"] == pytest.approx((10 + 64 + 10 + 10) / 4)
    assert m["accuracy_by_group"] == {"1": 1.0, "2": 0.5}


def test_sampled_metrics_average_the_estimator_over_problems():
    # problem 0: 1 of 4 correct, problem 1: 4 of 4, problem 2: gold unusable (skipped)
    samples = ([_j(0, r) for r in (1.0, 0.0, 0.0, 0.0)] + [_j(1, 1.0)] * 4 + [_j(2, None)] * 4)
    m = sampled_metrics(samples, ks=(1, 2, 4))
    assert m["problems"] == 2 and m["samples_per_problem"] == 4
    assert m["pass_at_k"]["1"] == pytest.approx((0.25 + 1.0) / 2)
    assert m["pass_at_k"]["2"] == pytest.approx((0.5 + 1.0) / 2)
    assert m["pass_at_k"]["4"] == pytest.approx(1.0)


def test_sampled_metrics_refuse_ragged_sample_counts():
    with pytest.raises(ValueError, match="different sample counts"):
        sampled_metrics([_j(0, 1.0), _j(0, 0.0), _j(1, 1.0)], ks=(1,))
