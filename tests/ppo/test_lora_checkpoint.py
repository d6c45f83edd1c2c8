"""LoRA step checkpoints without the frozen base (align.lora.checkpoint.LoraWeightFormat): model/ holds the
adapters and a reference to the base (path + content hash), the base is read back from its directory, a changed
base is one clear error, a from-scratch base is written once per run, the older full layout still resumes."""

from __future__ import annotations

import json

import pytest
import torch

from align.exceptions import CheckpointError
from align.model import MistralConfig, MistralForCausalLM
from align.model.checkpoint import checkpoint_content_hash, save_checkpoint
from align.lora.adapters import LoraConfig, apply_lora, lora_layers
from align.lora.checkpoint import ADAPTERS_FILE, BASE_REF_FILE, SCRATCH_BASE, lora_weight_format
from align.train.ckpt_format import weight_format_for

LORA = LoraConfig(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj", "down_proj"))


def _model(seed: int = 0) -> MistralForCausalLM:
    torch.manual_seed(seed)
    cfg = MistralConfig(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0)
    return MistralForCausalLM(cfg)


def _trained(model: MistralForCausalLM) -> MistralForCausalLM:
    apply_lora(model, LORA)
    with torch.no_grad():
        for layer in lora_layers(model).values():
            layer.lora_B.weight.normal_(0, 0.1)
    return model


def _read(fmt, model, model_dir) -> dict[str, torch.Tensor]:
    return dict(fmt.read(model, model_dir))


def test_a_step_holds_adapters_and_names_the_base(tmp_path):
    save_checkpoint(_model(), tmp_path / "start")
    policy = _trained(_model())
    fmt = lora_weight_format(LORA, policy, tmp_path / "start", tmp_path / "run")
    fmt.write(policy, policy.state_dict(), tmp_path / "step" / "model")
    files = sorted(p.name for p in (tmp_path / "step" / "model").iterdir())
    assert files == sorted([ADAPTERS_FILE, BASE_REF_FILE, "config.json"])  # no base weights
    ref = json.loads((tmp_path / "step" / "model" / BASE_REF_FILE).read_text())
    assert ref == {"path": str((tmp_path / "start").resolve()),
                   "content_hash": checkpoint_content_hash(tmp_path / "start")}
    back = _read(fmt, policy, tmp_path / "step" / "model")
    state = policy.state_dict()
    assert {k for k in back if k != "lm_head.weight"} >= {k for k in state if k != "lm_head.weight"}
    assert all(torch.equal(back[k], state[k]) for k in back)  # base from start/, adapters from the step
    assert not (tmp_path / "run" / "checkpoints" / SCRATCH_BASE).exists()


def test_a_changed_base_is_one_clear_error(tmp_path):
    save_checkpoint(_model(), tmp_path / "start")
    policy = _trained(_model())
    fmt = lora_weight_format(LORA, policy, tmp_path / "start", tmp_path / "run")
    fmt.write(policy, policy.state_dict(), tmp_path / "step" / "model")
    import shutil

    shutil.rmtree(tmp_path / "start")
    save_checkpoint(_model(seed=1), tmp_path / "start")  # another checkpoint at the same path
    with pytest.raises(CheckpointError, match=rf"{BASE_REF_FILE}: the LoRA base .*start changed"):
        _read(fmt, policy, tmp_path / "step" / "model")
    shutil.rmtree(tmp_path / "start")
    with pytest.raises(CheckpointError, match="frozen base .* cannot be read"):
        _read(fmt, policy, tmp_path / "step" / "model")


def test_a_from_scratch_base_is_written_once(tmp_path):
    policy = _trained(_model())
    run = tmp_path / "run"
    fmt = lora_weight_format(LORA, policy, None, run)
    base = run / "checkpoints" / SCRATCH_BASE
    fmt.write(policy, policy.state_dict(), tmp_path / "s1" / "model")
    first = (base / "model.safetensors").stat().st_mtime_ns
    with torch.no_grad():
        for layer in lora_layers(policy).values():
            layer.lora_B.weight.add_(1.0)
    fmt.write(policy, policy.state_dict(), tmp_path / "s2" / "model")
    assert (base / "model.safetensors").stat().st_mtime_ns == first  # not rewritten
    fresh = _trained(_model(seed=5))  # a resumed process: rebuilt, then filled from the checkpoint
    back = _read(lora_weight_format(LORA, fresh, None, run), fresh, tmp_path / "s2" / "model")
    assert all(torch.equal(back[k], policy.state_dict()[k]) for k in back)


def test_the_full_layout_of_older_checkpoints_still_reads(tmp_path):
    policy = _trained(_model())
    inner = weight_format_for(policy)
    inner.write(policy, policy.state_dict(), tmp_path / "old" / "model")  # what a LoRA step held before
    fmt = lora_weight_format(LORA, policy, tmp_path / "nowhere", tmp_path / "run")
    back = _read(fmt, policy, tmp_path / "old" / "model")
    assert all(torch.equal(back[k], policy.state_dict()[k]) for k in back)


def test_no_lora_keeps_the_family_format():
    assert lora_weight_format(None, _model(), None, None) is None
