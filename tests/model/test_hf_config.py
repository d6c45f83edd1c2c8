"""align.model.hf_config: config.json round trip, both RoPE spellings, and refusal of what is not implemented."""

from __future__ import annotations

import dataclasses
import json

import pytest

from align.exceptions import CheckpointError
from align.model import MistralConfig, load_hf_config, save_hf_config
from model_helpers import hf_config, tiny_config

# The hub's Mistral-7B-v0.3 config.json (transformers 4 spelling: top-level rope_theta, torch_dtype).
MISTRAL_7B_V03 = {
    "architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.42.0.dev0",
    "use_cache": True, "vocab_size": 32768,
}


def write(tmp_path, data):
    (tmp_path / "config.json").write_text(json.dumps(data))
    return tmp_path


def test_round_trip(tmp_path):
    cfg = tiny_config(tie_word_embeddings=True, sliding_window=64, pad_token_id=0)
    save_hf_config(cfg, tmp_path)
    assert load_hf_config(tmp_path) == cfg
    assert load_hf_config(tmp_path / "config.json") == cfg


def test_reads_mistral_7b_v03(tmp_path):
    cfg = load_hf_config(write(tmp_path, MISTRAL_7B_V03))
    assert (cfg.hidden_size, cfg.num_key_value_heads, cfg.head_dim, cfg.rope_theta) == (4096, 8, 128, 1e6)
    assert cfg.sliding_window is None and cfg.rms_norm_eps == 1e-5 and cfg.num_kv_groups == 4


def test_missing_keys_take_transformers_defaults(tmp_path):
    data = {k: v for k, v in MISTRAL_7B_V03.items() if k not in ("rms_norm_eps", "num_key_value_heads", "rope_theta")}
    cfg = load_hf_config(write(tmp_path, data))
    assert cfg.rms_norm_eps == 1e-6 and cfg.num_key_value_heads == 32 and cfg.rope_theta == 10000.0


@pytest.mark.parametrize("key,value", [
    ("rope_scaling", {"type": "linear", "factor": 2.0}), ("attention_bias", True), ("mlp_bias", True),
    ("hidden_act", "gelu"), ("attention_dropout", 0.1), ("quantization_config", {"quant_method": "gptq"}),
    ("some_new_field", 1), ("rope_parameters", {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}),
])
def test_refuses_unimplemented_fields_by_name(tmp_path, key, value):
    path = write(tmp_path, {**MISTRAL_7B_V03, key: value})
    with pytest.raises(CheckpointError, match=key) as err:
        load_hf_config(path)
    assert "config.json" in str(err.value)


@pytest.mark.parametrize("key,value,pattern", [
    ("model_type", "gemma2", "model_type"), ("hidden_size", "4096", "hidden_size"),
    ("tie_word_embeddings", 1, "tie_word_embeddings"), ("eos_token_id", [2, 3], "eos_token_id"),
    ("num_key_value_heads", 5, "multiple"), ("pad_token_id", 40000, "pad_token_id"),
])
def test_refuses_bad_values(tmp_path, key, value, pattern):
    with pytest.raises(CheckpointError, match=pattern):
        load_hf_config(write(tmp_path, {**MISTRAL_7B_V03, key: value}))


def test_missing_or_unreadable_file(tmp_path):
    with pytest.raises(CheckpointError, match="no config.json"):
        load_hf_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="unreadable"):
        load_hf_config(tmp_path)


def test_config_validates_itself():
    with pytest.raises(ValueError, match="head_dim"):
        MistralConfig(hidden_size=60, num_attention_heads=4, head_dim=15)
    assert dataclasses.replace(MistralConfig(), head_dim=None).head_dim == 32


@pytest.mark.oracle
def test_interop_with_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = tiny_config(num_key_value_heads=1, tie_word_embeddings=True, rope_theta=5e5, head_dim=24)
    hf_config(cfg).save_pretrained(tmp_path / "theirs")
    assert load_hf_config(tmp_path / "theirs") == cfg
    save_hf_config(cfg, tmp_path / "ours")
    back = transformers.AutoConfig.from_pretrained(tmp_path / "ours")
    assert type(back).__name__ == "MistralConfig"
    for f in dataclasses.fields(cfg):
        got = back.rope_parameters["rope_theta"] if f.name == "rope_theta" else getattr(back, f.name)
        assert got == getattr(cfg, f.name), f.name
