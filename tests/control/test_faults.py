"""align.train.faults: the grammar, what matches where, `once` across processes, the NaN forward hook, and that an
unarmed plan costs nothing but a check."""

from __future__ import annotations

import os
import signal

import pytest
import torch
from torch import nn

from align.exceptions import ConfigError
from align.train import faults
from align.train.faults import Fault, FaultInjected, parse_faults


@pytest.fixture(autouse=True)
def fresh_plan(monkeypatch):
    faults.reset()
    yield
    faults.reset()


def arm(monkeypatch, spec: str, state=None) -> None:
    monkeypatch.setenv(faults.FAULTS_ENV, spec)
    if state is not None:
        monkeypatch.setenv(faults.STATE_ENV, str(state))
    faults.reset()


def test_parse_every_action_and_key():
    got = parse_faults("kill@save:manifest,step=4,rank=0 ; signal:TERM@micro,step=3,micro=1 ;"
                       "delay:2.5@save:staged ; nan@micro,step=4+,rank=1 ; crash@micro,step=1")
    assert got[0] == Fault("kill", "", "save:manifest", step=4, rank=0, text="kill@save:manifest,step=4,rank=0")
    assert (got[1].action, got[1].arg, got[1].step, got[1].micro, got[1].rank) == ("signal", "TERM", 3, 1, None)
    assert (got[2].arg, got[2].step) == ("2.5", None)
    assert got[3].and_later and got[3].step == 4
    assert parse_faults("") == () and parse_faults(" ; ") == ()


@pytest.mark.parametrize("spec, says", [
    ("explode@micro", "unknown action 'explode'"),
    ("kill@nowhere", "POINT one of micro, save:begin"),
    ("kill", "expected ACTION@POINT"),
    ("signal:NOPE@micro", "expected a signal name"),
    ("delay:soon@micro", "expected a number of seconds"),
    ("nan@save:begin", "its point must be micro"),
    ("kill@micro,step=three", "bad key 'step=three'"),
    ("kill@micro,when=now", "bad key 'when=now'"),
    ("kill@micro,once", "once needs ALIGN_FAULTS_STATE"),
])
def test_malformed_spec_is_one_clear_error(monkeypatch, spec, says):
    monkeypatch.delenv(faults.STATE_ENV, raising=False)
    with pytest.raises(ConfigError, match="ALIGN_FAULTS") as exc:
        parse_faults(spec)
    assert says in str(exc.value) and repr(spec) in str(exc.value)


def test_matching_by_point_step_micro_rank():
    f = parse_faults("kill@micro,step=3,micro=1,rank=1")[0]
    assert f.matches("micro", 3, 1, 1)
    assert not f.matches("micro", 3, 0, 1) and not f.matches("micro", 3, 1, 0) and not f.matches("micro", 4, 1, 1)
    assert not f.matches("save:begin", 3, 1, 1)
    later = parse_faults("nan@micro,step=4+")[0]
    assert [later.matches("micro", s, 0, r) for s in (3, 4, 9) for r in (0, 1)] == [False] * 2 + [True] * 4
    every = parse_faults("delay:0@save:staged")[0]
    assert every.matches("save:staged", 1, 0, 0) and every.matches("save:staged", 7, 0, 3)


def test_unarmed_hooks_do_nothing(monkeypatch):
    monkeypatch.delenv(faults.FAULTS_ENV, raising=False)
    model = nn.Embedding(4, 2)
    faults.at_micro(1, 0, model)
    faults.at_save("save:begin", 1)
    assert faults.armed() == () and not model._forward_hooks


def test_crash_and_signal_fire_where_armed(monkeypatch, capfd):
    arm(monkeypatch, "crash@micro,step=2,micro=1")
    faults.at_micro(2, 0, nn.Linear(1, 1))  # another micro-batch: nothing
    with pytest.raises(FaultInjected, match="injected crash"):
        faults.at_micro(2, 1, nn.Linear(1, 1))
    assert "align.faults: rank 0 pid" in capfd.readouterr().err
    got = []
    old = signal.signal(signal.SIGUSR1, lambda s, _f: got.append(s))
    try:
        arm(monkeypatch, "signal:USR1@save:published,step=3")
        faults.at_save("save:manifest", 3)
        assert got == []
        faults.at_save("save:published", 3)
        assert got == [signal.SIGUSR1]  # delivered to this process, handled by its own handler
    finally:
        signal.signal(signal.SIGUSR1, old)


def test_once_fires_a_single_time_across_processes(monkeypatch, tmp_path):
    arm(monkeypatch, "crash@micro,step=1,once", state=tmp_path)
    with pytest.raises(FaultInjected):
        faults.at_micro(1, 0, nn.Linear(1, 1))
    faults.reset()  # a relaunched process: a new plan, the same state directory
    faults.at_micro(1, 0, nn.Linear(1, 1))
    assert len(os.listdir(tmp_path)) == 1


def test_nan_poisons_the_real_forward_only_where_armed(monkeypatch):
    from align.model import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    model = MistralForCausalLM(MistralConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                             num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                             max_position_embeddings=32))
    ids = torch.randint(0, 64, (2, 8))
    arm(monkeypatch, "nan@micro,step=2+,rank=0")
    faults.at_micro(1, 0, model)
    assert torch.isfinite(model(ids)).all()
    faults.at_micro(2, 0, model)
    logits = model(ids)
    assert torch.isnan(logits).all()
    logits.sum().backward()
    assert all(torch.isnan(p.grad).any() for p in model.parameters() if p.grad is not None)
    arm(monkeypatch, "nan@micro,step=2+,rank=1")  # another rank's fault: this forward is clean again
    faults.at_micro(3, 0, model)
    assert torch.isfinite(model(ids)).all()
