"""align.rl.report: the receipt's reward curve reads the rollout-level reward, skipping steps that sampled nothing."""

import math

import pytest

from align.rl.report import reward_curve
from align.utils.tracking import MetricsHistory


def write(path, values, trained):
    history = MetricsHistory(path)
    for step, (v, t) in enumerate(zip(values, trained), start=1):
        history.log(step, {"rollout/reward_mean": v, "reward_mean": t})
    return path


def test_curve_uses_the_rollout_reward_and_skips_steps_without_a_rollout(tmp_path):
    nan = math.nan  # minibatch 2 of each rollout: nothing sampled, logged as null
    path = write(tmp_path / "h.jsonl", [0.1, nan, 0.2, nan, 0.3, nan, 0.5, nan], [0.4, 0.3, 0.1, 0.2] * 2)
    curve = reward_curve(path, fraction=0.25)
    assert curve["reward_key"] == "rollout/reward_mean" and curve["reward_points"] == 4 and curve["steps"] == 8
    assert curve["reward_first"] == pytest.approx(0.1) and curve["reward_last"] == pytest.approx(0.5)
    assert curve["reward_rising"] and curve["reward_slope"] == pytest.approx(0.065)  # least squares over (1,3,5,7)
    trained = reward_curve(path, fraction=0.25, key="reward_mean")
    assert trained["reward_points"] == 8 and not trained["reward_rising"]


def test_no_points_gives_nan_and_not_rising(tmp_path):
    curve = reward_curve(write(tmp_path / "h.jsonl", [math.nan] * 3, [0.0] * 3))
    assert math.isnan(curve["reward_first"]) and not curve["reward_rising"] and curve["steps"] == 3
