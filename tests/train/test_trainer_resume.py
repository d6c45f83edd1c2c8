"""align.train.trainer + checkpoint: bit-exact resume at any boundary (also from a crash mid-window), incomplete
checkpoints skipped, retention and pins, history replay, extra_state round trip. One process; see
test_distributed.py for two gloo ranks."""

import json
import os

import pytest
import torch

from align.train import checkpoint as ckpt_io
from align.utils.tracking import read_history
from train_helpers import assert_bitwise_equal, build_sft, weights


class Crash(Exception):
    pass


def crash_at(micro: int):
    """A fault that raises before the `micro`-th micro-batch (1-based) of the run."""
    def fault(module, batch, info, count=[0]):
        count[0] += 1
        if count[0] == micro:
            raise Crash()
    return fault


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    t = build_sft(tmp_path_factory.mktemp("full"), max_steps=6, checkpoint_every=2)
    assert t.fit() == 0
    return weights(t.module), read_history(t.run_dir / "history.jsonl")


# micro-batch 5 = step 3's first (right after the step-2 checkpoint), 8 = step 4's second (mid-window),
# 11 = step 6's first (after step 4 and a skipped cadence point), 3 = before any checkpoint (restart from scratch)
@pytest.mark.parametrize("micro", [3, 5, 8, 11])
@pytest.mark.parametrize("optimizer", ["adamw", "adamw8bit"])
def test_crash_then_resume_is_bitwise_equal(tmp_path, uninterrupted, micro, optimizer):
    if optimizer == "adamw8bit":
        ref = build_sft(tmp_path / "ref", max_steps=6, checkpoint_every=2, optimizer=optimizer)
        ref.fit()
        expected, history = weights(ref.module), read_history(ref.run_dir / "history.jsonl")
    else:
        expected, history = uninterrupted
    with pytest.raises(Crash):
        build_sft(tmp_path / "run", max_steps=6, checkpoint_every=2, optimizer=optimizer, fault=crash_at(micro)).fit()
    resumed = build_sft(tmp_path / "run", max_steps=6, checkpoint_every=2, optimizer=optimizer)
    assert resumed.fit() == 0
    last_boundary = (micro - 1) // 2
    expected_from = last_boundary - last_boundary % 2
    assert (resumed.resumed_from.name if resumed.resumed_from else "step_0") == f"step_{expected_from}"
    assert_bitwise_equal(expected, weights(resumed.module))
    rows = read_history(resumed.run_dir / "history.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 7))  # replayed steps replace, never duplicate
    assert [r["loss"] for r in rows] == [r["loss"] for r in history]


def test_checkpoint_layout_manifest_and_hf_weights(tmp_path):
    t = build_sft(tmp_path, max_steps=2, checkpoint_every=1)
    t.fit()
    ck = tmp_path / "checkpoints" / "step_2"
    manifest = json.loads((ck / "manifest.json").read_text())
    assert manifest["kind"] == "train_checkpoint" and manifest["step"] == 2 and manifest["world_size"] == 1
    assert {"resume.pt", "model/config.json", "model/model.safetensors", "model/manifest.json"} <= set(manifest["files"])
    payload = torch.load(ck / "resume.pt", weights_only=True)  # plain data only
    assert payload["step"] == 2 and payload["micro_step"] == 4 and "optimizer" in payload["module"]
    from align.model.checkpoint import load_checkpoint

    assert_bitwise_equal(weights(t.module), load_checkpoint(ck / "model").state_dict())


@pytest.mark.parametrize("damage", ["no_manifest", "truncated_resume", "truncated_weights"])
def test_incomplete_newest_checkpoint_is_skipped_with_a_warning(tmp_path, uninterrupted, damage):
    with pytest.raises(Crash):
        build_sft(tmp_path, max_steps=6, checkpoint_every=2, fault=crash_at(11)).fit()  # leaves step_2, step_4
    newest = tmp_path / "checkpoints" / "step_4"
    if damage == "no_manifest":
        (newest / "manifest.json").unlink()
    else:
        path = newest / ("resume.pt" if damage == "truncated_resume" else "model/model.safetensors")
        os.truncate(path, path.stat().st_size // 2)
    with pytest.warns(UserWarning, match="skipping incomplete checkpoint step_4"):
        assert ckpt_io.latest_checkpoint(tmp_path / "checkpoints").name == "step_2"
    with pytest.warns(UserWarning, match="step_4"):
        resumed = build_sft(tmp_path, max_steps=6, checkpoint_every=2)
        assert resumed.fit() == 0
    assert resumed.resumed_from.name == "step_2"
    assert_bitwise_equal(uninterrupted[0], weights(resumed.module))


def test_latest_checkpoint_orders_by_step_number_not_name(tmp_path):
    t = build_sft(tmp_path, max_steps=10, checkpoint_every=1, keep_last=20)
    t.fit()
    assert ckpt_io.latest_checkpoint(tmp_path / "checkpoints").name == "step_10"  # "step_9" > "step_10" as text


def test_retention_keeps_last_k_and_pins(tmp_path):
    t = build_sft(tmp_path, max_steps=7, checkpoint_every=1, keep_last=2, pin_every=3)
    t.fit()
    left = sorted(int(p.name.split("_")[1]) for p in (tmp_path / "checkpoints").iterdir())
    assert left == [3, 6, 7]
    assert torch.load(tmp_path / "checkpoints" / "step_7" / "resume.pt", weights_only=True)["pinned"] == [3, 6]


def test_extra_state_round_trips_through_resume(tmp_path):
    from align.train.sft_module import SftTrainModule

    seen = {}

    def attach(t):  # give the module private state that changes every step
        module = t.module

        def extra_state():
            return {"baseline": torch.tensor([float(module.step)]), "history": [module.step] * 2}

        module.extra_state = extra_state
        module.load_extra_state = lambda state: seen.update(state)
        return t

    assert isinstance(build_sft(tmp_path, max_steps=1).module, SftTrainModule)
    t = attach(build_sft(tmp_path, max_steps=3, checkpoint_every=3))
    t.fit()
    attach(build_sft(tmp_path, max_steps=4, checkpoint_every=3)).fit()
    assert seen["history"] == [3, 3] and torch.equal(seen["baseline"], torch.tensor([3.0]))


def test_base_module_refuses_unexpected_extra_state(tmp_path):
    t = build_sft(tmp_path, max_steps=1)
    with pytest.raises(ValueError, match="no extra state"):
        t.module.load_extra_state({"x": 1})


def test_weight_loading_streams_pairs_fills_tied_aliases_and_names_problems(tmp_path):
    from train_helpers import tiny_model

    src = tiny_model(seed=3, tie_word_embeddings=True)
    t = build_sft(tmp_path, max_steps=1)
    tied = build_sft(tmp_path / "tied", max_steps=1)
    tied.module.model = tiny_model(seed=0, tie_word_embeddings=True)
    pairs = ((k, v) for k, v in src.state_dict().items() if k != "lm_head.weight")  # as an HF file holds them
    tied.module.load_model_state_dict(pairs)
    assert_bitwise_equal(src.state_dict(), tied.module.model.state_dict())
    assert tied.module.model.lm_head.weight is tied.module.model.model.embed_tokens.weight
    with pytest.raises(KeyError, match="lack"):
        t.module.load_model_state_dict({"model.norm.weight": torch.ones(32)})
    with pytest.raises(KeyError, match="not a parameter"):
        t.module.load_model_state_dict({"bogus.weight": torch.ones(1)})
