"""OLMoE checkpoints: family from config.json's model_type, the hub's per-expert file layout <-> the fused
parameters (both directions, streamed), strict config reading by field name, and bitwise align round trips.
The transformers round trips (both directions, fp32 logits within 1e-5) are in the oracle tier below."""

from __future__ import annotations

import json

import pytest
import torch

from align.exceptions import CheckpointError
from align.model import MistralForValueHead
from align.model.checkpoint import load_checkpoint, save_checkpoint, tokenizer_dir_for
from align.model.family import FAMILIES, family_of_config_dict
from align.model.hf_config import config_from_hf_dict
from align.model.config_io import hf_config_dict, load_hf_config
from align.model.olmoe import OlmoeForCausalLM
from align.model.olmoe_checkpoint import OLMOE_SPEC, fuse_hub_pairs, to_hub_layout
from align.model.safetensors_io import read_header, weight_map
from moe_helpers import hf_olmoe_config, random_ids, tiny_olmoe


def model(seed=0, **kw):
    torch.manual_seed(seed)
    return OlmoeForCausalLM(tiny_olmoe(**kw)).eval()


def file_keys(ckpt) -> set[str]:
    return set(weight_map(ckpt))


def test_align_roundtrip_is_bitwise_and_uses_hub_keys(tmp_path):
    ours = model(num_experts=4)
    save_checkpoint(ours, tmp_path / "c")
    keys = file_keys(tmp_path / "c")
    assert "model.layers.1.mlp.experts.3.up_proj.weight" in keys
    assert not any(k.endswith("gate_up_proj") for k in keys)
    cfg = json.loads((tmp_path / "c" / "config.json").read_text())
    assert cfg["model_type"] == "olmoe" and cfg["architectures"] == ["OlmoeForCausalLM"]
    assert "sliding_window" not in cfg and cfg["num_experts"] == 4
    back = load_checkpoint(tmp_path / "c")
    assert type(back) is OlmoeForCausalLM and back.config == ours.config
    for (k, a), (_, b) in zip(ours.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a, b), k
    ids = random_ids(ours.config, 2, 7)
    assert torch.equal(ours(ids), back(ids))


def test_bf16_file(tmp_path):
    ours = model()
    save_checkpoint(ours, tmp_path / "c", dtype=torch.bfloat16)
    header = read_header(next(iter(set(weight_map(tmp_path / "c").values()))))
    assert header["model.layers.0.mlp.experts.0.gate_proj.weight"][0] == "BF16"
    back = load_checkpoint(tmp_path / "c", dtype=torch.bfloat16)
    assert torch.equal(back.model.layers[0].mlp.experts.gate_up_proj, ours.model.layers[0].mlp.experts
                       .gate_up_proj.to(torch.bfloat16))


def test_hub_layout_both_directions():
    ours = model(num_experts=5)
    state = ours.state_dict()
    hub = to_hub_layout(state)
    i = ours.config.intermediate_size
    assert torch.equal(hub["model.layers.0.mlp.experts.2.up_proj.weight"],
                       state["model.layers.0.mlp.experts.gate_up_proj"][2, i:])
    fused = dict(fuse_hub_pairs(hub.items(), ours.config))
    assert fused.keys() == state.keys()
    assert all(torch.equal(fused[k], state[k]) for k in state)


def test_missing_expert_named(tmp_path):
    ours = model(num_experts=4)
    hub = to_hub_layout(ours.state_dict())
    del hub["model.layers.1.mlp.experts.2.down_proj.weight"]
    with pytest.raises(CheckpointError, match=r"experts\.2\.down_proj"):
        dict(fuse_hub_pairs(hub.items(), ours.config))
    save_checkpoint(ours, tmp_path / "c")
    hub_file = next(iter(set(weight_map(tmp_path / "c").values())))
    from safetensors.torch import load_file, save_file
    tensors = load_file(hub_file)
    del tensors["model.layers.0.mlp.experts.1.gate_proj.weight"]
    save_file(tensors, hub_file)
    (tmp_path / "c" / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match=r"missing keys \['model\.layers\.0\.mlp\.experts\.1\.gate_proj"):
        load_checkpoint(tmp_path / "c")


def hub_config() -> dict:
    """allenai/OLMoE-1B-7B-0924's config.json (transformers 4 spelling)."""
    return {"architectures": ["OlmoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
            "clip_qkv": None, "eos_token_id": 50279, "hidden_act": "silu", "hidden_size": 2048,
            "initializer_range": 0.02, "intermediate_size": 1024, "max_position_embeddings": 4096,
            "model_type": "olmoe", "norm_topk_prob": False, "num_attention_heads": 16, "num_experts": 64,
            "num_experts_per_tok": 8, "num_hidden_layers": 16, "num_key_value_heads": 16,
            "output_router_logits": False, "pad_token_id": 1, "rms_norm_eps": 1e-05, "rope_scaling": None,
            "rope_theta": 10000.0, "router_aux_loss_coef": 0.01, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16", "transformers_version": "4.43.0.dev0", "use_cache": True,
            "vocab_size": 50304}


def test_reads_the_hub_config():
    cfg = config_from_hf_dict(hub_config(), spec=OLMOE_SPEC)
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.intermediate_size, cfg.head_dim) == (64, 8, 1024, 128)
    assert cfg.bos_token_id is None and cfg.norm_topk_prob is False
    assert family_of_config_dict(hub_config()).name == "olmoe"
    assert config_from_hf_dict(hf_config_dict(cfg), spec=OLMOE_SPEC) == cfg


@pytest.mark.parametrize("key,value,match", [
    ("clip_qkv", 8.0, "clip_qkv"), ("rope_scaling", {"type": "linear", "factor": 2.0}, "rope_scaling"),
    ("attention_bias", True, "attention_bias"), ("moe_capacity", 1.25, "moe_capacity"),
    ("num_experts_per_tok", 65, "num_experts_per_tok"), ("num_experts", "64", "num_experts"),
])
def test_strict_config_refuses_by_field(key, value, match):
    data = hub_config() | {key: value}
    with pytest.raises(CheckpointError, match=match):
        config_from_hf_dict(data, spec=OLMOE_SPEC)


def test_family_from_model_type_only(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(hub_config() | {"model_type": "mixtral"}))
    with pytest.raises(CheckpointError, match="mixtral"):
        load_hf_config(tmp_path)
    assert set(FAMILIES) == {"mistral", "olmoe", "llama", "qwen2", "qwen3"}


def test_wrong_class_and_no_tokenizer_fallback(tmp_path):
    save_checkpoint(model(), tmp_path / "c")
    with pytest.raises(CheckpointError, match="cannot be loaded as MistralForValueHead"):
        load_checkpoint(tmp_path / "c", cls=MistralForValueHead)
    with pytest.raises(CheckpointError, match="explicit tokenizer directory"):
        tokenizer_dir_for(tmp_path / "c")


@pytest.mark.oracle
@pytest.mark.parametrize("experts,top_k,norm", [(4, 1, False), (8, 2, True), (16, 8, False)])
def test_transformers_roundtrips(tmp_path, experts, top_k, norm):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(experts)
    cfg = tiny_olmoe(num_experts=experts, num_experts_per_tok=top_k, norm_topk_prob=norm)
    ids = random_ids(cfg, 2, 9, seed=top_k)
    # transformers-saved -> align
    theirs = transformers.OlmoeForCausalLM(hf_olmoe_config(cfg)).eval()
    theirs.save_pretrained(tmp_path / "hf")
    ours = load_checkpoint(tmp_path / "hf")
    assert ours.config == cfg
    ref = theirs(ids).logits
    assert (ours(ids) - ref).abs().max().item() <= 1e-5 * max(1.0, ref.abs().max().item())
    # align-saved -> transformers
    ours2 = model(seed=experts + 1, num_experts=experts, num_experts_per_tok=top_k, norm_topk_prob=norm)
    save_checkpoint(ours2, tmp_path / "align")
    back = transformers.OlmoeForCausalLM.from_pretrained(tmp_path / "align").eval()
    mine = ours2(ids)
    assert (back(ids).logits - mine).abs().max().item() <= 1e-5 * max(1.0, mine.abs().max().item())
