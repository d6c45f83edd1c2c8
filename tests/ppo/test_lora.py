"""align.lora.adapters: wrapping, freezing, merge, and the peft file layout (oracle: peft loads it with equal logits)."""

from __future__ import annotations

import json

import pytest
import torch

from align.model import MistralForCausalLM
from align.model.checkpoint import load_checkpoint, save_checkpoint
from align.lora.adapters import (ADAPTER_CONFIG, LoraConfig, LoraLinear, apply_lora, lora_layers, merge, save_adapter,
                            trainable_parameters)
from model_helpers import random_ids, tiny_config

CFG = LoraConfig(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj", "down_proj"))


def _lora_model(tied: bool = False, cfg: LoraConfig = CFG, seed: int = 0):
    torch.manual_seed(seed)
    base = MistralForCausalLM(tiny_config(tie_word_embeddings=tied))
    model = MistralForCausalLM(tiny_config(tie_word_embeddings=tied), init=False)
    model.load_state_dict(base.state_dict())
    return base, apply_lora(model, cfg)


def _train_adapters(model, seed: int = 1):
    """Give B nonzero values (as after training), so merge and the peft check see a real update."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in lora_layers(model).values():
            layer.lora_B.weight.copy_(torch.randn(layer.lora_B.weight.shape, generator=g) * 0.05)


def test_start_equals_base_bitwise():
    base, model = _lora_model()
    ids = random_ids(base.config, 2, 12)
    assert torch.equal(model(ids), base(ids))
    model.train()  # dropout 0: training mode changes nothing either
    assert torch.equal(model(ids), base(ids))


def test_wraps_targets_without_copying_the_base():
    torch.manual_seed(0)
    model = MistralForCausalLM(tiny_config())
    q = model.model.layers[0].self_attn.q_proj
    apply_lora(model, CFG)
    wrapped = model.model.layers[0].self_attn.q_proj
    assert isinstance(wrapped, LoraLinear) and wrapped.weight is q.weight
    assert not isinstance(model.model.layers[0].self_attn.k_proj, LoraLinear)
    assert len(lora_layers(model)) == 3 * model.config.num_hidden_layers
    assert "model.layers.0.self_attn.q_proj.weight" in model.state_dict()


def test_only_adapter_parameters_train():
    _, model = _lora_model()
    names = [n for n, _ in trainable_parameters(model)]
    assert names and all(n.endswith(("lora_A.weight", "lora_B.weight")) for n in names)
    assert len(names) == 2 * 3 * model.config.num_hidden_layers
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    assert "model.embed_tokens.weight" in frozen and "model.layers.1.self_attn.q_proj.weight" in frozen
    ids = random_ids(model.config, 2, 12)
    model(ids).square().mean().backward()
    grads = {n for n, p in model.named_parameters() if p.grad is not None}
    assert grads == set(names)
    # B starts at zero, so on the first step only B moves: A's gradient (B^T times the output gradient) is zero
    layer = model.model.layers[0].self_attn.q_proj
    assert layer.lora_B.weight.grad.abs().sum() > 0
    assert not layer.lora_A.weight.grad.any()


def test_merge_is_base_plus_scaled_product_exactly():
    base, model = _lora_model()
    _train_adapters(model)
    expected = {}
    for name, layer in lora_layers(model).items():
        w = base.get_submodule(name).weight
        expected[name] = w + (layer.lora_B.weight @ layer.lora_A.weight) * (CFG.alpha / CFG.rank)
    ids = random_ids(base.config, 2, 12)
    before = model(ids)
    merge(model)
    assert not lora_layers(model)
    for name, w in expected.items():
        assert torch.equal(model.get_submodule(name).weight, w), name
    assert set(model.state_dict()) == set(base.state_dict())
    for name, p in base.state_dict().items():
        if name.rpartition(".")[0] not in expected:
            assert torch.equal(model.state_dict()[name], p), name
    assert all(p.requires_grad for p in model.parameters())
    assert (model(ids) - before).abs().max().item() <= 1e-5


def test_merge_leaves_the_shared_base_weight_unchanged():
    torch.manual_seed(0)
    model = MistralForCausalLM(tiny_config())
    w = model.model.layers[0].self_attn.q_proj.weight
    before = w.detach().clone()
    apply_lora(model, CFG)
    _train_adapters(model)
    merge(model)
    assert torch.equal(w, before)


def test_merged_checkpoint_round_trips(tmp_path):
    _, model = _lora_model()
    _train_adapters(model)
    merge(model)
    out = save_checkpoint(model, tmp_path / "merged")
    loaded = load_checkpoint(out)
    ids = random_ids(model.config, 2, 12)
    assert torch.equal(loaded(ids), model(ids))


def test_bad_configs_and_targets_are_named():
    with pytest.raises(ValueError, match="rank"):
        LoraConfig(rank=0)
    with pytest.raises(ValueError, match="dropout"):
        LoraConfig(dropout=1.0)
    model = MistralForCausalLM(tiny_config())
    with pytest.raises(ValueError, match="'qkv' matches no module of MistralForCausalLM.*q_proj"):
        apply_lora(model, LoraConfig(target_modules=("qkv",)))
    tied = MistralForCausalLM(tiny_config(tie_word_embeddings=True))
    with pytest.raises(ValueError, match="lm_head.weight is tied"):
        apply_lora(tied, LoraConfig(target_modules=("lm_head",)))
    apply_lora(model, CFG)
    with pytest.raises(ValueError, match="already has LoRA"):
        apply_lora(model, CFG)


def test_olmoe_expert_targets_are_refused_by_name():
    """OLMoE's experts are stacked 3-D weights, not nn.Linear: a target naming them (the default targets do:
    down_proj) is one error naming the module and what is supported, never attention-only in silence."""
    from align.model.olmoe import OlmoeConfig, OlmoeForCausalLM

    model = OlmoeForCausalLM(OlmoeConfig(vocab_size=384, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                         num_experts=4, num_experts_per_tok=2, pad_token_id=0))
    with pytest.raises(ValueError, match=r"'down_proj' matches model.layers.0.mlp.experts.down_proj \(a \(4, 64, 32\) "
                                         r"parameter\), which is not an nn.Linear.*'o_proj', 'q_proj', 'v_proj'"):
        apply_lora(model, LoraConfig())  # the default targets
    with pytest.raises(ValueError, match=r"'gate' matches model.layers.0.mlp.gate \(Router\)"):
        apply_lora(model, LoraConfig(target_modules=("q_proj", "gate")))
    with pytest.raises(ValueError, match="'gate_proj' matches no module of OlmoeForCausalLM"):
        apply_lora(model, LoraConfig(target_modules=("q_proj", "gate_proj")))
    assert not any(p.requires_grad is False for p in model.parameters())  # refused before anything was frozen
    apply_lora(model, LoraConfig(target_modules=("q_proj", "k_proj", "v_proj", "o_proj")))  # attention: supported
    assert len(lora_layers(model)) == 8


def test_dropout_applies_to_the_adapter_path_only():
    cfg = LoraConfig(rank=4, alpha=8.0, dropout=0.5, target_modules=("q_proj",))
    base, model = _lora_model(cfg=cfg)
    ids = random_ids(base.config, 2, 12)
    model.train()
    assert torch.equal(model(ids), base(ids))  # B = 0: whatever dropout drops, the output is the base
    _train_adapters(model)
    torch.manual_seed(3)
    a = model(ids)
    torch.manual_seed(4)
    assert not torch.equal(a, model(ids))
    model.eval()
    assert torch.equal(model(ids), model(ids))


@pytest.mark.oracle
@pytest.mark.parametrize("tied", [False, True])
def test_adapter_loads_in_peft_with_equal_logits(tmp_path, tied):
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft", reason="peft (oracle extra) is not installed")
    base, model = _lora_model(tied=tied)
    _train_adapters(model)
    base_dir = save_checkpoint(base, tmp_path / "base")
    adapter_dir = save_adapter(model, CFG, tmp_path / "adapter", base_model=str(base_dir))
    assert json.loads((adapter_dir / ADAPTER_CONFIG).read_text())["peft_type"] == "LORA"
    hf = transformers.MistralForCausalLM.from_pretrained(base_dir).eval()
    theirs = peft.PeftModel.from_pretrained(hf, adapter_dir).eval()
    ids = random_ids(base.config, 2, 12)
    ours = model.eval()(ids)
    with torch.no_grad():
        ref = theirs(input_ids=ids).logits
        assert (ours - ref).abs().max().item() <= 1e-5
        plain = theirs.merge_and_unload()
    merge(model)
    theirs_state = plain.state_dict()
    for name in (f"model.layers.{i}.{m}.weight" for i in range(base.config.num_hidden_layers)
                 for m in ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj")):
        assert torch.equal(model.state_dict()[name], theirs_state[name]), name
