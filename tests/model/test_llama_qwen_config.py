"""The Llama 3.x, Qwen 2.5 and Qwen 3 `config.json` files as published read into their families' configs (the
hub's own field values, transformers 4 spellings), and what is not implemented is refused with one error naming
the field: other rope types, sliding windows in each spelling, biases where the family has none, M-RoPE."""

from __future__ import annotations

import json

import pytest

from align.exceptions import CheckpointError
from align.model.config_io import hf_config_dict, load_hf_config
from align.model.dense_configs import LlamaConfig, Qwen2Config, Qwen3Config
from align.model.family import FAMILIES, family_of_config
from align.model.hf_config import RopeScaling

LLAMA_32_1B_INSTRUCT = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 131072,
    "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16,
    "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0", "use_cache": True, "vocab_size": 128256,
}
QWEN25_05B_INSTRUCT = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645,
    "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02, "intermediate_size": 4864,
    "max_position_embeddings": 32768, "max_window_layers": 21, "model_type": "qwen2", "num_attention_heads": 14,
    "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.43.1", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}
QWEN3_06B = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024,
    "initializer_range": 0.02, "intermediate_size": 3072, "max_position_embeddings": 40960,
    "max_window_layers": 28, "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
    "sliding_window": None, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}


def write(tmp_path, data: dict):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return path


def test_published_configs_read(tmp_path):
    llama = load_hf_config(write(tmp_path, LLAMA_32_1B_INSTRUCT))
    assert type(llama) is LlamaConfig and llama.eos_token_id == (128001, 128008, 128009)
    assert llama.rope_scaling == RopeScaling(32.0, 1.0, 4.0, 8192) and llama.num_kv_groups == 4
    assert llama.tie_word_embeddings and llama.head_dim == 64 and not llama.qkv_bias
    qwen2 = load_hf_config(write(tmp_path, QWEN25_05B_INSTRUCT))
    assert type(qwen2) is Qwen2Config and qwen2.sliding_window is None  # use_sliding_window false: no window
    assert qwen2.qkv_bias and qwen2.head_dim == 64 and qwen2.rope_scaling is None and qwen2.qk_norm is None
    qwen3 = load_hf_config(write(tmp_path, QWEN3_06B))
    assert type(qwen3) is Qwen3Config and qwen3.head_dim == 128 and qwen3.qk_norm == "head"
    assert qwen3.rope_theta == 1e6 and not qwen3.qkv_bias


@pytest.mark.parametrize("published", [LLAMA_32_1B_INSTRUCT, QWEN25_05B_INSTRUCT, QWEN3_06B])
def test_written_config_reads_back_equal(tmp_path, published):
    cfg = load_hf_config(write(tmp_path, published))
    family = family_of_config(cfg)
    again = load_hf_config(write(tmp_path, hf_config_dict(cfg, architecture=family.causal_lm.hf_architecture)))
    assert again == cfg


def test_omitted_head_dim_of_qwen3_is_transformers_default(tmp_path):
    data = {k: v for k, v in QWEN3_06B.items() if k != "head_dim"} | {"hidden_size": 512}
    assert load_hf_config(write(tmp_path, data)).head_dim == 128


@pytest.mark.parametrize("published,key,value,named", [
    (LLAMA_32_1B_INSTRUCT, "rope_scaling", {"rope_type": "dynamic", "factor": 2.0}, "rope_scaling.rope_type"),
    (LLAMA_32_1B_INSTRUCT, "rope_scaling", {"rope_type": "yarn", "factor": 4.0}, "rope_scaling.rope_type"),
    (LLAMA_32_1B_INSTRUCT, "rope_parameters", {"rope_type": "longrope", "rope_theta": 1e4}, "rope_parameters"),
    (LLAMA_32_1B_INSTRUCT, "rope_scaling", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                            "high_freq_factor": 4.0, "beta": 2}, "rope_scaling"),
    (LLAMA_32_1B_INSTRUCT, "sliding_window", 4096, "sliding_window"),
    (LLAMA_32_1B_INSTRUCT, "attention_bias", True, "attention_bias"),
    (LLAMA_32_1B_INSTRUCT, "mlp_bias", True, "mlp_bias"),
    (QWEN25_05B_INSTRUCT, "use_sliding_window", True, "use_sliding_window"),
    (QWEN25_05B_INSTRUCT, "use_mrope", True, "use_mrope"),
    (QWEN25_05B_INSTRUCT, "rope_scaling", {"type": "yarn", "factor": 4.0,
                                           "original_max_position_embeddings": 32768}, "rope_scaling.rope_type"),
    (QWEN25_05B_INSTRUCT, "rope_scaling", {"rope_type": "llama3", "factor": 4.0}, "rope_scaling.rope_type"),
    (QWEN25_05B_INSTRUCT, "head_dim", 128, "head_dim"),
    (QWEN3_06B, "use_sliding_window", True, "use_sliding_window"),
    (QWEN3_06B, "layer_types", ["full_attention"] * 27 + ["sliding_attention"], "layer_types"),
    (QWEN3_06B, "attention_bias", True, "attention_bias"),
    (QWEN3_06B, "rope_parameters", {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}, "rope_parameters"),
    (QWEN3_06B, "eos_token_id", [151645, "x"], "eos_token_id"),
    (QWEN3_06B, "num_key_value_heads", 5, "multiple"),
])
def test_refuses_by_field_name(tmp_path, published, key, value, named):
    path = write(tmp_path, {**published, key: value})
    with pytest.raises(CheckpointError) as err:
        load_hf_config(path)
    message = str(err.value)
    assert named in message and "config.json" in message and "\n" not in message


def test_full_attention_layer_types_are_accepted(tmp_path):
    cfg = load_hf_config(write(tmp_path, {**QWEN3_06B, "layer_types": ["full_attention"] * 28}))
    assert cfg.sliding_window is None


def test_registry_has_the_three_heads_per_family():
    for name in ("llama", "qwen2", "qwen3"):
        family = FAMILIES[name]
        roles = [m.hf_architecture.split("For", 1)[1] for m in family.models]
        assert roles == ["CausalLM", "SequenceClassification", "TokenClassification"]
        for mistral_model in FAMILIES["mistral"].models:
            assert family.model_like(mistral_model) in family.models
