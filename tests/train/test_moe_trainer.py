"""The Trainer's checkpoint code with an OLMoE model: the WeightFormat seam (align.train.ckpt_format) writes the
hub's per-expert layout and streams it back fused; a crash-then-resume MoE SFT run is bitwise equal to an
uninterrupted one. The Trainer itself has no MoE branch: the format comes from the model's family."""

from __future__ import annotations

import torch

from align.model.checkpoint import load_checkpoint
from align.model.safetensors_io import weight_map
from align.train import checkpoint as ckpt_io
from align.train.ckpt_format import DenseFormat, OlmoeFormat, weight_format_for
from moe_train_helpers import tiny_moe
from train_helpers import assert_bitwise_equal, build_sft, tiny_model, weights


class Crash(Exception):
    pass


def test_format_follows_the_model_family():
    assert isinstance(weight_format_for(tiny_moe()), OlmoeFormat)
    assert isinstance(weight_format_for(tiny_model()), DenseFormat)


def test_crash_then_resume_moe_sft_is_bitwise_equal(tmp_path):
    full = build_sft(tmp_path / "full", max_steps=4, checkpoint_every=2, model=tiny_moe())
    assert full.fit() == 0
    expected = weights(full.module)

    def fault(module, batch, info, count=[0]):
        count[0] += 1
        if count[0] == 6:  # step 3's second micro-batch, after the step-2 checkpoint
            raise Crash()

    try:
        build_sft(tmp_path / "run", max_steps=4, checkpoint_every=2, model=tiny_moe(), fault=fault).fit()
    except Crash:
        pass
    ckpt = ckpt_io.latest_checkpoint(tmp_path / "run" / "checkpoints")
    keys = set(weight_map(ckpt / ckpt_io.MODEL_DIR))
    assert "model.layers.0.mlp.experts.3.down_proj.weight" in keys and not any("gate_up" in k for k in keys)
    resumed = build_sft(tmp_path / "run", max_steps=4, checkpoint_every=2, model=tiny_moe(seed=1))
    assert resumed.fit() == 0
    assert resumed.resumed_from.name == "step_2"
    assert_bitwise_equal(expected, weights(resumed.module))
    published = full.publish_final(tmp_path / "final")
    loaded = load_checkpoint(published)
    assert_bitwise_equal(expected, {k: v for k, v in loaded.state_dict().items()})
