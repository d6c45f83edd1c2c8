"""align.train.probes: each tripwire fires on what it watches and stays quiet on a healthy run; arm-time self-test
refuses thresholds that cannot fire; probe state survives resume; default probes stay quiet on a real tiny run."""

import math

import pytest
import torch

from align.exceptions import ConfigError
from align.train.probes import (EntropyProbe, GradNormProbe, LossSpikeProbe, ProbeConfig, Tripwires,
                                WeightMovementProbe)
from align.utils.tracking import read_history
from train_helpers import build_sft, tiny_model


def feed(probe, series):
    return [probe.observe(dict(m)) for m in series]


def test_grad_norm_needs_patience_consecutive_excursions_and_ignores_nan():
    p = GradNormProbe(ProbeConfig(grad_norm_max=10.0, grad_norm_patience=2))
    out = feed(p, [{"grad_norm": 50.0}, {"grad_norm": 1.0}, {"grad_norm": 50.0}, {"grad_norm": math.nan},
                   {"grad_norm": 50.0}])
    assert out[:4] == [None] * 4 and "grad_norm 50" in out[4]


def test_loss_spike_logs_z_and_halts_after_consecutive_spikes():
    p = LossSpikeProbe(ProbeConfig(loss_spike_min_history=5, loss_spike_patience=2, loss_spike_sigmas=4.0))
    calm = [{"loss": 3.0 - 0.01 * i} for i in range(10)]
    assert feed(p, calm) == [None] * 10
    m = {"loss": 30.0}
    assert p.observe(m) is None and m["probe/loss_z"] > 4 and m["probe/loss_spikes"] == 1.0
    assert "sigma above" in p.observe({"loss": 30.0})
    restored = LossSpikeProbe(p.cfg)
    restored.load_state_dict(p.state_dict())
    assert restored.state_dict() == p.state_dict()


def test_loss_spike_excludes_spikes_from_its_baseline():
    p = LossSpikeProbe(ProbeConfig(loss_spike_min_history=5, loss_spike_patience=100))
    feed(p, [{"loss": 2.0 + 0.01 * (i % 2)} for i in range(10)])
    feed(p, [{"loss": 50.0}] * 20)
    assert max(p.window) < 3.0


def test_entropy_back_to_uniform_after_learning_halts_but_a_fresh_model_does_not():
    p = EntropyProbe(ProbeConfig(), vocab_size=100)
    assert p.observe({"entropy": math.log(100)}) is None  # a fresh model is near-uniform
    assert p.observe({"entropy": 1.0}) is None  # learning
    assert "near-uniform" in p.observe({"entropy": math.log(100)})
    restored = EntropyProbe(ProbeConfig(), vocab_size=100)
    restored.load_state_dict(p.state_dict())
    assert restored.learned


def test_weight_movement_explosion_and_stall():
    w = torch.nn.Parameter(torch.ones(4096))
    p = WeightMovementProbe(ProbeConfig(weight_update_max=0.5, weight_stall_patience=2), [w])
    with torch.no_grad():
        w.add_(0.01)
    m = {"applied": 1.0}
    assert p.observe(m) is None and 0 < m["probe/weight_update"] < 0.02
    assert p.observe({"applied": 1.0}) is None  # one still step
    assert "did not move" in p.observe({"applied": 1.0})
    with torch.no_grad():
        w.mul_(3.0)
    assert "relative weight update" in p.observe({"applied": 1.0})


@pytest.mark.parametrize("bad", [dict(grad_norm_max=math.inf), dict(loss_spike_sigmas=math.inf),
                                 dict(entropy_max_fraction=2.0), dict(weight_update_max=math.inf)])
def test_self_test_refuses_thresholds_that_cannot_fire(bad):
    with pytest.raises(ConfigError, match="self-test"):
        Tripwires(ProbeConfig(**bad), list(tiny_model().parameters()), vocab_size=256)


def test_unknown_probe_is_a_config_error():
    with pytest.raises(ValueError, match="unknown probe"):
        ProbeConfig(armed=("grad_norm", "vibes"))


def test_default_tripwires_are_quiet_on_a_healthy_run_and_log_their_columns(tmp_path):
    t = build_sft(tmp_path, max_steps=8)
    t.callbacks.append(Tripwires(ProbeConfig(), list(t.module.model.parameters()), 256))
    assert t.fit() == 0
    rows = read_history(tmp_path / "history.jsonl")
    assert all("probe/weight_update" in r and "probe/loss_z" in r for r in rows)
    assert all(0 < r["probe/weight_update"] < 0.5 for r in rows)
