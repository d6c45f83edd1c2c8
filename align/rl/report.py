"""The reward curve of a GRPO run, summarised from its `history.jsonl` for the receipt.

`reward_first` / `reward_last`: mean `reward_mean` over the first and the last `fraction` of the logged steps (each
step's reward is the mean over its minibatch, a noisy number, so single rows say little); `reward_slope`: the least-
squares slope of reward_mean against the step (reward per step); `reward_rising` is reward_last > reward_first."""

from __future__ import annotations

import math
import os

from align.utils.tracking import read_history


def reward_curve(history: str | os.PathLike, fraction: float = 0.25, key: str = "reward_mean") -> dict:
    rows = [(r["step"], r[key]) for r in read_history(history) if isinstance(r.get(key), (int, float))]
    if not rows:
        return {"reward_first": math.nan, "reward_last": math.nan, "reward_slope": math.nan, "reward_rising": False,
                "steps": 0}
    k = max(1, int(len(rows) * fraction))
    first = sum(v for _, v in rows[:k]) / k
    last = sum(v for _, v in rows[-k:]) / k
    mx = sum(s for s, _ in rows) / len(rows)
    my = sum(v for _, v in rows) / len(rows)
    var = sum((s - mx) ** 2 for s, _ in rows)
    slope = sum((s - mx) * (v - my) for s, v in rows) / var if var else 0.0
    return {"reward_first": first, "reward_last": last, "reward_slope": slope, "reward_rising": last > first,
            "steps": len(rows)}
