"""The reward curve of a GRPO run, summarised from its `history.jsonl` for the receipt.

The curve is `rollout/reward_mean` by default: the sampled policy's mean reward over every valid group a rollout
generated, kept or dropped by dynamic sampling, logged on the step that sampled it (NaN, hence skipped, on the other
steps). The trained rows' `reward_mean` is a poor learning curve: dynamic sampling keeps mixed groups and fills with
all-wrong ones, so it measures the filter as much as the policy.
`reward_first` / `reward_last`: the mean over the first and the last `fraction` of the logged points (single rows are
noisy); `reward_slope`: the least-squares slope against the step (reward per step); `reward_rising` is
reward_last > reward_first; `reward_key` names the column, `reward_points` counts its logged points, `steps` the
history's rows."""

from __future__ import annotations

import math
import os

from align.rl.canary import paired_gain
from align.utils.tracking import read_history


def reward_curve(history: str | os.PathLike, fraction: float = 0.25, key: str = "rollout/reward_mean") -> dict:
    history = read_history(history)
    rows = [(r["step"], r[key]) for r in history if isinstance(r.get(key), (int, float))]
    if not rows:
        return {"reward_first": math.nan, "reward_last": math.nan, "reward_slope": math.nan, "reward_rising": False,
                "steps": len(history), "reward_points": 0, "reward_key": key}
    k = max(1, int(len(rows) * fraction))
    first = sum(v for _, v in rows[:k]) / k
    last = sum(v for _, v in rows[-k:]) / k
    mx = sum(s for s, _ in rows) / len(rows)
    my = sum(v for _, v in rows) / len(rows)
    var = sum((s - mx) ** 2 for s, _ in rows)
    slope = sum((s - mx) * (v - my) for s, v in rows) / var if var else 0.0
    return {"reward_first": first, "reward_last": last, "reward_slope": slope, "reward_rising": last > first,
            "steps": len(history), "reward_points": len(rows), "reward_key": key}


def heldout_receipt(rows: int, before: dict, after: dict, start_checkpoint: str,
                    history: str | os.PathLike) -> dict:
    """An RL stage's metrics.json (the receipt's metrics): held-out greedy accuracy of the start and of the result
    (align.rl.canary.evaluate's dicts), per level, the paired gain with its interval, stop rates, the start
    checkpoint's hash and the reward curve above. The GRPO and PPO stages' receipt."""
    return {"heldout_rows": rows, "start_accuracy": before["pass@1"], "accuracy": after["pass@1"],
            "accuracy_gain": after["pass@1"] - before["pass@1"],
            "start_accuracy_by_level": before["pass@1_by_group"], "accuracy_by_level": after["pass@1_by_group"],
            **paired_gain(before, after), "start_stop_rate": before["stop_rate"], "stop_rate": after["stop_rate"],
            "start_checkpoint": start_checkpoint, **reward_curve(history)}
