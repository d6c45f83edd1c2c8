"""router_dtype: "activation" (default) computes the router logits as transformers' OlmoeTopKRouter does, in the
activations' dtype; "fp32" computes them as that router does on fp32 copies of x and the weight (OLMo-core's bf16
recipe), while the block's output keeps the activations' dtype. A training option: from [model.moe] onto the
routers, never into config.json."""

from __future__ import annotations

import json

import pytest
import torch

from align.model.checkpoint import load_checkpoint, save_checkpoint
from align.model.family import from_scratch
from align.model.hf_config import MistralConfig
from align.model.moe import Router, SparseMoeBlock
from align.model.olmoe import ExpertLayout, OlmoeForCausalLM, set_router_dtype
from moe_helpers import hf_olmoe_config, random_ids, tiny_olmoe


@pytest.mark.oracle
def test_bf16_activation_is_transformers_and_fp32_is_the_fp32_router():
    pytest.importorskip("transformers")
    from transformers.models.olmoe.modeling_olmoe import OlmoeTopKRouter

    cfg = tiny_olmoe(num_experts=16, num_experts_per_tok=4)
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(cfg.num_experts, cfg.hidden_size, generator=g).bfloat16()
    x = torch.randn(64, cfg.hidden_size, generator=g).bfloat16()
    block = SparseMoeBlock(cfg.hidden_size, cfg.intermediate_size, cfg.num_experts, cfg.num_experts_per_tok,
                           cfg.norm_topk_prob)
    for m in (block.gate, block.experts):
        m.init_parameters(0.2)
    block = block.bfloat16()
    hf_bf16, hf_fp32 = OlmoeTopKRouter(hf_olmoe_config(cfg)).bfloat16(), OlmoeTopKRouter(hf_olmoe_config(cfg))
    with torch.no_grad():
        block.gate.weight.copy_(weight)
        hf_bf16.weight.copy_(weight)
        hf_fp32.weight.copy_(weight.float())  # the fp32 router: fp32 copies of the bf16 weight and of x
    ref_bf16, ref_fp32 = hf_bf16(x)[0], hf_fp32(x.float())[0]

    out_act, logits_act = block(x)
    assert logits_act.dtype == torch.bfloat16 and torch.equal(logits_act, ref_bf16)
    set_router_dtype(block, "fp32")
    out_fp32, logits_fp32 = block(x)
    assert logits_fp32.dtype == torch.float32 and torch.equal(logits_fp32, ref_fp32)
    assert out_act.dtype == out_fp32.dtype == torch.bfloat16  # the top-k weights are cast to the activations'
    assert not torch.equal(logits_fp32, logits_act.float())  # in bf16 the switch changes the logits


def test_fp32_router_gradient_reaches_the_bf16_weight():
    block = SparseMoeBlock(32, 16, 8, 2, False)
    for m in (block.gate, block.experts):
        m.init_parameters(0.2)
    block = block.bfloat16()
    set_router_dtype(block, "fp32")
    x = torch.randn(5, 32).bfloat16().requires_grad_(True)
    out, logits = block(x)
    (out.float().square().sum() + logits.logsumexp(-1).sum()).backward()
    assert block.gate.weight.grad.dtype == torch.bfloat16 and block.gate.weight.grad.abs().sum() > 0
    assert x.grad.dtype == torch.bfloat16


def test_fp32_model_is_unchanged_by_the_switch():
    torch.manual_seed(1)
    model = OlmoeForCausalLM(tiny_olmoe())
    ids = random_ids(model.config, 2, 9)
    before = model(ids)
    set_router_dtype(model, "fp32")
    assert torch.equal(model(ids), before)


def test_model_moe_table_sets_the_routers_and_config_json_stays_hf(tmp_path):
    init = MistralConfig(vocab_size=128, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = from_scratch(init, ExpertLayout(num_experts=4, router_dtype="fp32"))
    routers = [m for m in model.modules() if isinstance(m, Router)]
    assert len(routers) == 2 and all(r.router_dtype == "fp32" for r in routers)
    save_checkpoint(model, tmp_path)
    assert not any("router" in k and "dtype" in k for k in json.loads((tmp_path / "config.json").read_text()))
    loaded = load_checkpoint(tmp_path)
    assert loaded.config == model.config
    assert all(m.router_dtype == "activation" for m in loaded.modules() if isinstance(m, Router))


def test_bad_router_dtype_is_named():
    with pytest.raises(ValueError, match="router_dtype must be one of"):
        Router(8, 4, "bf16")
    with pytest.raises(ValueError, match="router_dtype must be one of"):
        set_router_dtype(OlmoeForCausalLM(tiny_olmoe()), "fp16")


def test_sft_stage_config_reads_the_switch():
    from pathlib import Path

    from align.config import load_config
    from align.exceptions import ConfigError
    from align.stages.sft import SftStageConfig

    path = Path(__file__).resolve().parents[2] / "configs" / "olmoe_tiny" / "sft.toml"
    assert load_config(path, SftStageConfig).model.moe.router_dtype == "activation"
    assert load_config(path, SftStageConfig, ["model.moe.router_dtype=fp32"]).model.moe.router_dtype == "fp32"
    with pytest.raises(ConfigError, match="router_dtype"):
        load_config(path, SftStageConfig, ["model.moe.router_dtype=bf16"])
