"""align.rl.tripwires: each tripwire fires on a series that must trip it, stays quiet on one that must not, and its
state (window, runs, latch) survives a save/restore."""

import math

import pytest

from align.rl.tripwires import GrpoHealth, HealthConfig

HEALTHY = {"entropy": 1.2, "ratio_mean": 1.01, "rho_abs_log_mean": 0.001}


def feed(health, rows):
    return [health.observe({**HEALTHY, **row}) for row in rows]


def test_quiet_on_a_healthy_noisy_run():
    rewards = [0.4 + 0.05 * math.sin(i) + 0.01 * i for i in range(40)]
    assert feed(GrpoHealth(), [{"reward_mean": r} for r in rewards]) == [None] * 40


def test_entropy_collapse_trips_after_patience():
    out = feed(GrpoHealth(HealthConfig(entropy_patience=3)), [{"reward_mean": 0.5, "entropy": 0.001}] * 3)
    assert out[:2] == [None, None] and "entropy" in out[2]
    out = feed(GrpoHealth(HealthConfig(entropy_max=5.0)), [{"reward_mean": 0.5, "entropy": 9.0}] * 3)
    assert "entropy" in out[-1]


def test_ratio_and_train_infer_mismatch_trip():
    assert "ratio" in feed(GrpoHealth(), [{"reward_mean": 0.5, "ratio_mean": 2.0}] * 2)[-1]
    assert "rho" in feed(GrpoHealth(), [{"reward_mean": 0.5, "rho_abs_log_mean": 0.9}] * 2)[-1]
    assert feed(GrpoHealth(), [{"reward_mean": 0.5, "ratio_mean": 2.0}, {"reward_mean": 0.5}] * 2)[-1] is None


def test_reward_collapse_trips_and_the_latch_survives_resume():
    cfg = HealthConfig(collapse_window=5, collapse_min_history=5, collapse_margin=0.2, collapse_patience=2)
    h = GrpoHealth(cfg)
    assert feed(h, [{"reward_mean": 0.6}] * 5 + [{"reward_mean": 0.3}]) == [None] * 6
    state = h.state_dict()
    assert state["collapse_run"] == 1 and state["window"] == [0.6] * 5  # the low step stayed out of the window
    resumed = GrpoHealth(cfg)
    resumed.load_state_dict(state)
    assert "reward mean 0.300 below" in resumed.observe({**HEALTHY, "reward_mean": 0.3})
    after = GrpoHealth(cfg)
    after.load_state_dict(resumed.state_dict())
    assert "latch" in after.observe({**HEALTHY, "reward_mean": 0.9})  # latched: a recovery does not reopen it


def test_baseline_column_and_disarming():
    h = GrpoHealth(HealthConfig(armed=()))
    m = {**HEALTHY, "reward_mean": 0.5, "entropy": 0.0, "ratio_mean": 9.0}
    assert [h.observe(m) for _ in range(5)] == [None] * 5
    assert math.isnan(m["health/reward_baseline"])  # the column is always there; disarmed, no baseline forms
    armed = GrpoHealth(HealthConfig(collapse_min_history=2))
    for r in (0.4, 0.6):
        armed.observe({**HEALTHY, "reward_mean": r})
    m = {**HEALTHY, "reward_mean": 0.5}
    armed.observe(m)
    assert m["health/reward_baseline"] == 0.5
    with pytest.raises(ValueError, match="unknown tripwire"):
        HealthConfig(armed=("vibes",))
