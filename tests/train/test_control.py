"""align.train.control in one process: signal stop at a boundary, a second SIGINT during the save, wall budget,
non-finite skips (no update, schedule frozen) up to the skip cap, and the skip-fraction rule."""

import os
import signal

import pytest

from align.exceptions import HaltError
from align.exit_codes import read_halt_marker
from align.train import checkpoint as ckpt_io
from align.train.control import Flags, SkipTracker
from align.utils.tracking import read_history
from train_helpers import assert_bitwise_equal, build_sft, weights


def signal_at(micro: int, sig=signal.SIGTERM):
    def fault(module, batch, info, count=[0]):
        count[0] += 1
        if count[0] == micro:
            os.kill(os.getpid(), sig)
    return fault


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_at_the_boundary_with_a_checkpoint_and_resumes_exactly(tmp_path, sig):
    full = build_sft(tmp_path / "full", max_steps=6, checkpoint_every=4)
    full.fit()
    before = signal.getsignal(sig)  # SIG_IGN for SIGINT when pytest itself runs in a background job
    cut = build_sft(tmp_path / "cut", max_steps=6, checkpoint_every=4, fault=signal_at(6, sig))  # step 3, 2nd micro
    assert cut.fit() == 128 + sig
    assert cut.step == 3 and ckpt_io.latest_checkpoint(tmp_path / "cut" / "checkpoints").name == "step_3"
    assert read_halt_marker(tmp_path / "cut") is None  # a signal is not a verdict: the supervisor may relaunch
    assert signal.getsignal(sig) == before  # handlers restored
    resumed = build_sft(tmp_path / "cut", max_steps=6, checkpoint_every=4)
    assert resumed.fit() == 0
    assert_bitwise_equal(weights(full.module), weights(resumed.module))


def test_second_sigint_during_the_final_save_does_not_corrupt_it(tmp_path):
    t = build_sft(tmp_path, max_steps=6, checkpoint_every=0, fault=signal_at(4, signal.SIGINT))
    inner = t._write_weights

    def write_and_interrupt(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # lands in the middle of the save
        return inner(*args, **kwargs)

    t._write_weights = write_and_interrupt
    assert t.fit() == 130
    ck = ckpt_io.latest_checkpoint(tmp_path / "checkpoints")
    assert ck.name == "step_2" and ckpt_io.checkpoint_problem(ck) is None


def test_wall_budget_checkpoints_writes_halt_and_exits_82(tmp_path):
    t = build_sft(tmp_path, max_steps=6, checkpoint_every=0, max_wall_seconds=0.0)
    assert t.fit() == 82
    assert t.step == 1 and ckpt_io.latest_checkpoint(tmp_path / "checkpoints").name == "step_1"
    assert read_halt_marker(tmp_path)["exit_code"] == 82


def test_nonfinite_loss_skips_without_update_then_halts_81(tmp_path):
    def poison_from_step_3(module, batch, info, count=[0]):
        count[0] += 1
        if count[0] == 5:
            poison_from_step_3.before = (weights(module), module.step)
            module.poison = True

    t = build_sft(tmp_path, max_steps=20, checkpoint_every=0, fault=poison_from_step_3)
    with pytest.raises(HaltError) as exc:
        t.fit()
    assert exc.value.exit_code == 81 and "consecutive skipped" in str(exc.value)
    assert t.step == 6  # steps 3, 4, 5, 6 skipped: 4 > max_consecutive_skipped_steps = 3
    before_w, before_step = poison_from_step_3.before
    assert_bitwise_equal(before_w, weights(t.module))  # no update on a skipped step
    assert t.module.step == before_step == 2  # the schedule did not advance
    rows = read_history(tmp_path / "history.jsonl")
    assert [r["applied"] for r in rows] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert rows[-1]["loss"] is None and rows[-1]["skipped_total"] == 4.0
    assert read_halt_marker(tmp_path)["exit_code"] == 81


def test_skip_fraction_rule_applies_after_the_grace_period():
    tracker = SkipTracker(max_consecutive=3, max_fraction=0.05, fraction_after=100)
    for i in range(99):
        tracker.record(Flags(skipped=(i % 10 == 0)))  # 10% bad, never 2 in a row
        assert tracker.verdict() is None
    tracker.record(Flags())
    assert "exceed train.max_skipped_fraction" in tracker.verdict()
    restored = SkipTracker(3, 0.05, 100)
    restored.load_state_dict(tracker.state_dict())
    assert restored.verdict() == tracker.verdict()


def test_a_loss_nonfinite_on_its_own_also_counts_as_bad():
    tracker = SkipTracker(max_consecutive=0, max_fraction=1.0, fraction_after=1)
    tracker.record(Flags(nonfinite=True, skipped=False))
    assert tracker.verdict() is not None


def test_tripwire_halt_writes_halt_json_and_raises_80(tmp_path):
    from align.train.callbacks import Callback

    class Trip(Callback):
        name = "trip"

        def observe(self, trainer, metrics):
            return "test verdict" if trainer.step == 2 else None

    with pytest.raises(HaltError) as exc:
        build_sft(tmp_path, max_steps=5, callbacks=[Trip()]).fit()
    assert exc.value.exit_code == 80 and "rank 0: test verdict" in str(exc.value)
    assert read_halt_marker(tmp_path)["reason"] == str(exc.value)


def test_collective_timeout_shortens_once_after_the_first_step(tmp_path, monkeypatch):
    import align.train.trainer as trainer_mod

    calls = []
    monkeypatch.setattr(trainer_mod, "set_pg_timeout", calls.append)
    monkeypatch.setenv("ALIGN_PG_TIMEOUT_S", "1800")
    build_sft(tmp_path, max_steps=3, pg_timeout_after_first_step_s=120.0).fit()
    assert calls == [120.0]
    monkeypatch.setenv("ALIGN_PG_TIMEOUT_S", "60")  # never lengthened past the environment's bound
    build_sft(tmp_path, max_steps=5, pg_timeout_after_first_step_s=120.0).fit()  # resumes at 3: first step is 4
    assert calls == [120.0, 60.0]


def test_data_exhausted_ends_the_run_at_a_boundary_with_a_checkpoint(tmp_path):
    from train_helpers import FiniteLoader, sft_windows

    t = build_sft(tmp_path, max_steps=50, checkpoint_every=0, loader=FiniteLoader(sft_windows(3, 2)))
    assert t.fit() == 0
    assert t.step == 3 and ckpt_io.latest_checkpoint(tmp_path / "checkpoints").name == "step_3"

