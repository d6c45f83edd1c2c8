"""Oracle: align's Llama 3, Qwen 2 and Qwen 3 equal transformers' on random weights (every parameter random:
biases, norm weights, per-head q/k norms) of several shapes: GQA ratios 1/2/4, tied and untied embeddings, q/k/v
biases on (Qwen 2) and off, Llama 3's scaled RoPE; fp32 logits within 1e-5 (they come out bitwise equal here).
Checkpoints cross both ways (align save -> `from_pretrained`; `save_pretrained`, sharded or not -> align load), the
value / reward heads load as `...ForSequenceClassification` / `...ForTokenClassification`, and a LoRA adapter
align saves loads in peft with equal logits."""

from __future__ import annotations

import json

import pytest
import torch

from align.lora.adapters import LoraConfig, apply_lora, save_adapter
from align.model.checkpoint import load_checkpoint, save_checkpoint
from align.model.family import FAMILIES
from dense_helpers import dense_config, dense_model, hf_twin, random_ids

pytestmark = pytest.mark.oracle
transformers = pytest.importorskip("transformers")

FAMILY_NAMES = ("llama", "qwen2", "qwen3")
TOL = 1e-5


def close(ours: torch.Tensor, ref: torch.Tensor) -> bool:
    return (ours.float() - ref.float()).abs().max().item() <= TOL * max(1.0, ref.abs().max().item())


@pytest.mark.parametrize("family", FAMILY_NAMES)
@pytest.mark.parametrize("kv_heads", [4, 2, 1])  # GQA ratios 1, 2, 4
@pytest.mark.parametrize("tied", [False, True])
def test_fp32_logits_equal_transformers(family, kv_heads, tied):
    model = dense_model(family, seed=kv_heads, num_key_value_heads=kv_heads, tie_word_embeddings=tied)
    twin = hf_twin(model)
    if tied:
        assert twin.lm_head.weight.data_ptr() == twin.model.embed_tokens.weight.data_ptr()
    ids = random_ids(model.config, 3, 70)  # past llama3's original length (64) in the test shape
    assert close(model(ids), twin(ids).logits)


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_padded_batch_and_gradients_equal_transformers(family):
    model = dense_model(family, seed=5)
    twin = hf_twin(model)
    ids = random_ids(model.config, 3, 24)
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[0, 15:] = False
    mask[2, 6:] = False
    logits, ref = model(ids, mask), twin(ids, attention_mask=mask.long()).logits
    assert close(logits[mask], ref[mask])
    logits[mask].logsumexp(-1).sum().backward()
    ref[mask].logsumexp(-1).sum().backward()
    theirs = dict(twin.named_parameters())
    for name, p in model.named_parameters():
        assert close(p.grad, theirs[name].grad), name


def test_the_family_options_are_real():
    """The parity above is not a vacuous one: without llama3 scaling, without Qwen 2's biases or without Qwen 3's
    q/k norms, the same weights give other logits."""
    ids = random_ids(dense_config("llama"), 1, 70)
    llama = dense_model("llama")
    plain = dense_model("llama", rope_scaling=None)
    assert not close(llama(ids), plain(ids))
    qwen2 = dense_model("qwen2")
    assert qwen2.model.layers[0].self_attn.q_proj.bias is not None
    before = qwen2(ids)
    with torch.no_grad():
        qwen2.model.layers[0].self_attn.k_proj.bias.zero_()
    assert not close(qwen2(ids), before)
    qwen3 = dense_model("qwen3")
    assert tuple(qwen3.model.layers[0].self_attn.q_norm.weight.shape) == (32,)
    before = qwen3(ids)
    with torch.no_grad():
        qwen3.model.layers[1].self_attn.q_norm.weight.fill_(1.0)
    assert not close(qwen3(ids), before)


@pytest.mark.parametrize("family", FAMILY_NAMES)
@pytest.mark.parametrize("tied,shard", [(True, None), (False, 40_000), (True, 40_000)])
def test_align_checkpoint_loads_in_transformers(tmp_path, family, tied, shard):
    model = dense_model(family, tie_word_embeddings=tied)
    out = save_checkpoint(model, tmp_path / "ck", max_shard_bytes=shard)
    assert (out / "model.safetensors.index.json").is_file() == (shard is not None)
    index = sorted(json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]) if shard else []
    assert ("lm_head.weight" in index) == (shard is not None and not tied)
    twin = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(twin).__name__ == model.hf_architecture
    ids = random_ids(model.config, 2, 70)
    assert close(model(ids), twin(ids).logits)


@pytest.mark.parametrize("family", FAMILY_NAMES)
@pytest.mark.parametrize("tied,shard", [(True, None), (False, "30KB"), (True, "30KB")])
def test_transformers_checkpoint_loads_in_align(tmp_path, family, tied, shard):
    twin = hf_twin(dense_model(family, seed=3, tie_word_embeddings=tied))
    twin.save_pretrained(tmp_path / "hf", **({} if shard is None else {"max_shard_size": shard}))
    if shard is not None:
        assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    ours = load_checkpoint(tmp_path / "hf")
    assert type(ours) is FAMILIES[family].causal_lm
    assert ours.config == dense_config(family, tie_word_embeddings=tied)
    theirs = twin.state_dict()
    for key, value in ours.state_dict().items():
        assert torch.equal(value, theirs[key]), key
    ids = random_ids(ours.config, 2, 70)
    assert close(ours(ids), twin(ids).logits)


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_heads_load_in_transformers_classification_models(tmp_path, family):
    fam = FAMILIES[family]
    value = dense_model(family, cls=fam.model_like(FAMILIES["mistral"].models[1]))
    out = save_checkpoint(value, tmp_path / "v")
    twin = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
    assert type(twin).__name__ == value.hf_architecture and twin.config.num_labels == 1
    ids = random_ids(value.config, 2, 12)
    ref = twin.score(twin.model(ids).last_hidden_state).squeeze(-1)
    assert close(value(ids), ref)
    for named in (fam.models[1], FAMILIES["mistral"].models[1]):  # a stage naming Mistral's critic class
        loaded = load_checkpoint(out, cls=named)
        assert type(loaded) is type(value) and torch.equal(loaded(ids), value(ids))
    prm = dense_model(family, cls=fam.models[2], num_labels=2)
    twin = transformers.AutoModelForTokenClassification.from_pretrained(save_checkpoint(prm, tmp_path / "p")).eval()
    assert type(twin).__name__ == prm.hf_architecture
    assert close(prm(ids), twin(ids).logits)
    loaded = load_checkpoint(tmp_path / "p", cls=FAMILIES["mistral"].models[2])
    assert type(loaded) is type(prm) and loaded.num_labels == 2 and torch.equal(loaded(ids), prm(ids))


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_lora_adapter_loads_in_peft(tmp_path, family):
    peft = pytest.importorskip("peft")
    base = dense_model(family, seed=7, tie_word_embeddings=True)
    base_dir = save_checkpoint(base, tmp_path / "base")
    model = load_checkpoint(base_dir)
    cfg = LoraConfig(rank=4, alpha=8.0)
    apply_lora(model, cfg)
    with torch.no_grad():  # B starts at zero; make the adapters matter
        g = torch.Generator().manual_seed(1)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    save_adapter(model, cfg, tmp_path / "adapter", base_model=str(base_dir))
    hf = transformers.AutoModelForCausalLM.from_pretrained(base_dir).eval()
    peft_model = peft.PeftModel.from_pretrained(hf, tmp_path / "adapter").eval()
    ids = random_ids(model.config, 2, 20)
    ours = model(ids)
    assert not close(ours, base(ids))
    assert close(ours, peft_model(ids).logits)
