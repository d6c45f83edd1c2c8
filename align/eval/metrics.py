"""Evaluation metrics over judged samples: accuracy, the unbiased pass@k estimator, format, length, truncation.

Pure functions on plain records (no torch), so the receipt's numbers can be recomputed from `samples.jsonl`.
A sample whose gold answer cannot be read (reward None) gives no signal either way: it is counted in
`gold_unusable` and left out of every denominator, never scored as wrong."""

from __future__ import annotations

from dataclasses import dataclass
from math import comb
from typing import Iterable, Sequence


@dataclass(frozen=True)
class Judged:
    """One decoded response, judged. `reward` is the verifier's (1.0 / 0.0 / None when the gold is unusable)."""

    row: int  # row of the eval shard set
    group: str  # the row's group (difficulty level of the bundled task)
    reward: float | None
    format_ok: bool
    num_tokens: int  # generated tokens, the stop token included
    truncated: bool  # finish reason "length": the answer was cut off


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of P(at least one of k samples is correct) from n samples with c correct (Chen et al.
    2021): 1 - C(n-c, k) / C(n, k). Exact in integers (`math.comb`), so no overflow or cancellation."""
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:
        return 1.0  # every k-subset holds a correct sample
    return 1.0 - comb(n - c, k) / comb(n, k)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def greedy_metrics(samples: Sequence[Judged]) -> dict:
    """accuracy, format_rate, mean_length, truncation_rate (over every sample), accuracy per group."""
    usable = [s for s in samples if s.reward is not None]
    groups: dict[str, list[float]] = {}
    for s in usable:
        groups.setdefault(s.group, []).append(s.reward)
    return {
        "accuracy": _mean([s.reward for s in usable]),
        "examples": len(samples),
        "gold_unusable": len(samples) - len(usable),
        "format_rate": _mean([float(s.format_ok) for s in samples]),
        "mean_length": _mean([float(s.num_tokens) for s in samples]),
        "truncation_rate": _mean([float(s.truncated) for s in samples]),
        "accuracy_by_group": {g: _mean(r) for g, r in sorted(groups.items())},
    }


def sampled_metrics(samples: Iterable[Judged], ks: Sequence[int]) -> dict:
    """pass@k for each k (mean over problems of the unbiased estimate), from every problem's n samples.
    Problems with an unusable gold are skipped; every problem must have the same n."""
    per_row: dict[int, list[Judged]] = {}
    for s in samples:
        per_row.setdefault(s.row, []).append(s)
    counts = [(len(v), sum(1 for s in v if s.reward == 1.0)) for v in per_row.values()
              if all(s.reward is not None for s in v)]
    sizes = {n for n, _ in counts}
    if len(sizes) > 1:
        raise ValueError(f"sampled_metrics: problems have different sample counts {sorted(sizes)}")
    n = sizes.pop() if sizes else 0
    flat = [s for v in per_row.values() for s in v]
    return {
        "pass_at_k": {str(k): _mean([pass_at_k(n, c, k) for n, c in counts]) for k in ks if k <= n},
        "samples_per_problem": n,
        "problems": len(counts),
        "sampled_format_rate": _mean([float(s.format_ok) for s in flat]),
        "sampled_mean_length": _mean([float(s.num_tokens) for s in flat]),
        "sampled_truncation_rate": _mean([float(s.truncated) for s in flat]),
    }
