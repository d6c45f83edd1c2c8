"""align.train.identity + Trainer: a checkpoint is resumed only by the run that wrote it. A changed config or input
starts training afresh (old checkpoints set aside), and the result equals a fresh run bit for bit."""

import json

from align.config import load_config
from align.stages.sft import SftStageConfig
from align.train import checkpoint as ckpt_io
from align.train.identity import CODE_DIGEST_ENV, identity_difference, run_identity
from align.utils.tracking import read_history
from train_helpers import assert_bitwise_equal, build_sft, weights

SFT_TOML = "configs/smoke/sft.toml"
A = {"config": "a" * 64, "inputs": {"shards": "s1"}}
B = {"config": "b" * 64, "inputs": {"shards": "s1"}}


def test_operational_keys_do_not_change_identity_but_training_keys_do(monkeypatch):
    monkeypatch.delenv(CODE_DIGEST_ENV, raising=False)
    inputs = {"shards": "s1", "base": "b1"}
    base = run_identity(load_config(SFT_TOML, SftStageConfig), inputs)
    for same in (["train.checkpoint_every=7", "train.keep_last=5", "train.max_wall_seconds=60.0"],
                 ["preflight.min_free_disk_gib=9.0", "supervisor.max_retries=0"]):
        assert run_identity(load_config(SFT_TOML, SftStageConfig, same), inputs) == base, same
    for other in (["optimizer.lr=0.5"], ["train.max_steps=999"], ["run.seed=99"], ["loader.micro_batch_size=3"]):
        changed = run_identity(load_config(SFT_TOML, SftStageConfig, other), inputs)
        assert identity_difference(changed, base) == "changed since it was written: config", other
    moved = run_identity(load_config(SFT_TOML, SftStageConfig), {"shards": "s2", "base": "b1"})
    assert identity_difference(moved, base) == "changed since it was written: input 'shards'"
    assert "no run identity" in identity_difference(None, base)
    json.dumps(base)  # it lives in a JSON manifest
    monkeypatch.setenv(CODE_DIGEST_ENV, "c" * 64)  # the pipeline passes the stage's code digest
    recoded = run_identity(load_config(SFT_TOML, SftStageConfig), inputs)
    assert identity_difference(recoded, base) == "changed since it was written: input 'code'"


def test_same_identity_resumes(tmp_path):
    first = build_sft(tmp_path, max_steps=4, checkpoint_every=2, identity=A)
    assert first.fit() == 0
    again = build_sft(tmp_path, max_steps=4, checkpoint_every=2, identity=A)
    assert again.fit() == 0
    assert again.resumed_from is not None and again.resumed_from.name == "step_4"
    assert ckpt_io.checkpoint_identity(again.resumed_from) == A


def test_changed_identity_trains_afresh_and_equals_a_fresh_run(tmp_path):
    fresh = build_sft(tmp_path / "fresh", max_steps=4, checkpoint_every=2, identity=B)
    assert fresh.fit() == 0
    old = build_sft(tmp_path / "run", max_steps=4, checkpoint_every=2, identity=A, model_seed=5)
    assert old.fit() == 0
    new = build_sft(tmp_path / "run", max_steps=4, checkpoint_every=2, identity=B)
    assert new.fit() == 0
    assert new.resumed_from is None
    assert_bitwise_equal(weights(new.module), weights(fresh.module))
    aside = tmp_path / "run" / "checkpoints.superseded"
    assert ckpt_io.checkpoint_identity(ckpt_io.latest_checkpoint(aside)) == A  # kept once, for inspection
    assert ckpt_io.checkpoint_identity(ckpt_io.latest_checkpoint(new.ckpt_root)) == B
    assert [r["step"] for r in read_history(tmp_path / "run" / "history.jsonl")] == [1, 2, 3, 4]


def test_checkpoint_without_identity_is_not_resumed_by_an_identified_run(tmp_path):
    assert build_sft(tmp_path, max_steps=2, checkpoint_every=1).fit() == 0  # identity None: pre-identity layout
    run = build_sft(tmp_path, max_steps=2, checkpoint_every=1, identity=A)
    assert run.fit() == 0 and run.resumed_from is None


def test_publish_final_checks_the_round_trip(tmp_path, monkeypatch):
    import pytest

    from align.model.roundtrip import RoundtripError, check_published

    trainer = build_sft(tmp_path, max_steps=2, checkpoint_every=0)
    assert trainer.fit() == 0
    final = trainer.publish_final(tmp_path / "final")
    # the gathered-weights path (FSDP / GPU) agrees with the in-memory model path
    assert check_published(trainer.module.model, final, weights=trainer.module.full_model_state_dict())["forward_equal"]
    write = trainer._write_weights

    def corrupt(weights, out_dir, **kwargs):  # a save bug: one tensor altered on its way to disk
        bad = dict(weights)
        key = sorted(bad)[-1]
        bad[key] = bad[key] + 1e-3
        return write(bad, out_dir, **kwargs)

    monkeypatch.setattr(trainer, "_write_weights", corrupt)
    with pytest.raises(RoundtripError, match="differs after the round trip"):
        trainer.publish_final(tmp_path / "final2")
