"""align.train.schedulers: shapes, warmup, floors, and statelessness in the step count."""

import math

import pytest

from align.train.schedulers import SchedulerConfig, lr_multiplier


def curve(cfg, total):
    return [lr_multiplier(cfg, s, total) for s in range(total)]


def test_warmup_starts_above_zero_and_reaches_one():
    c = curve(SchedulerConfig(name="constant", warmup_steps=4), 10)
    assert c[:5] == [0.25, 0.5, 0.75, 1.0, 1.0]


def test_cosine_from_one_to_floor():
    cfg = SchedulerConfig(name="cosine", warmup_steps=2, min_lr_ratio=0.1)
    c = curve(cfg, 12)
    assert c[2] == 1.0
    assert all(a >= b for a, b in zip(c[2:], c[3:]))
    assert math.isclose(lr_multiplier(cfg, 12, 12), 0.1)
    assert math.isclose(lr_multiplier(cfg, 7, 12), 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))


def test_linear_decays_to_floor_and_stays():
    cfg = SchedulerConfig(name="linear", warmup_steps=0, min_lr_ratio=0.0)
    assert curve(cfg, 5) == pytest.approx([1.0, 0.8, 0.6, 0.4, 0.2])
    assert lr_multiplier(cfg, 50, 5) == 0.0


def test_wsd_is_flat_then_decays_over_the_tail():
    cfg = SchedulerConfig(name="wsd", warmup_steps=2, min_lr_ratio=0.0, decay_fraction=0.25)
    c = curve(cfg, 20)
    assert c[:2] == [0.5, 1.0] and set(c[2:15]) == {1.0}
    assert c[15:] == pytest.approx([1.0, 0.8, 0.6, 0.4, 0.2])


def test_stateless_resume_equals_uninterrupted():
    cfg = SchedulerConfig(name="cosine", warmup_steps=3)
    full = curve(cfg, 30)
    resumed = [lr_multiplier(cfg, s, 30) for s in range(17, 30)]
    assert resumed == full[17:]


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="min_lr_ratio"):
        SchedulerConfig(min_lr_ratio=1.5)
    with pytest.raises(ValueError, match="warmup_steps"):
        SchedulerConfig(warmup_steps=-1)
