"""Oracle: checkpoints cross between align and transformers in both directions, sharded and unsharded.

align -> transformers: `from_pretrained` loads what align saved and predicts the same logits.
transformers -> align: what `save_pretrained` wrote loads with bitwise-equal weights."""

from __future__ import annotations

import pytest
import torch

from align.model import MistralForCausalLM, MistralForProcessReward, MistralForValueHead
from align.model.checkpoint import checkpoint_content_hash, load_checkpoint, save_checkpoint
from model_helpers import hf_config, random_ids, tiny_config

pytestmark = pytest.mark.oracle
transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("tied,shard", [(False, None), (True, None), (False, 25_000), (True, 25_000)])
def test_align_checkpoint_loads_in_transformers(tmp_path, tied, shard):
    model = MistralForCausalLM(tiny_config(tie_word_embeddings=tied, num_key_value_heads=1))
    out = save_checkpoint(model, tmp_path / "ck", max_shard_bytes=shard)
    twin = transformers.MistralForCausalLM.from_pretrained(out).eval()
    ids = random_ids(model.config, 2, 12)
    assert (twin(ids).logits - model(ids)).abs().max().item() <= 1e-5
    if tied:
        assert twin.lm_head.weight.data_ptr() == twin.model.embed_tokens.weight.data_ptr()


def test_align_bf16_checkpoint_loads_in_transformers_bf16(tmp_path):
    model = MistralForCausalLM(tiny_config())
    out = save_checkpoint(model, tmp_path / "ck", dtype=torch.bfloat16)
    twin = transformers.MistralForCausalLM.from_pretrained(out, dtype=torch.bfloat16).eval()
    ours = load_checkpoint(out, dtype=torch.bfloat16)
    ids = random_ids(model.config, 2, 12)
    ref = twin(ids).logits.float()
    assert (ours(ids).float() - ref).abs().max().item() <= 2**-7 * ref.abs().max().item()


@pytest.mark.parametrize("tied,shard", [(False, None), (True, None), (False, "30KB"), (True, "30KB")])
def test_transformers_checkpoint_loads_bitwise(tmp_path, tied, shard):
    cfg = tiny_config(tie_word_embeddings=tied)
    torch.manual_seed(0)
    twin = transformers.MistralForCausalLM(hf_config(cfg)).eval()
    kwargs = {} if shard is None else {"max_shard_size": shard}
    twin.save_pretrained(tmp_path / "hf", **kwargs)
    if shard is not None:
        assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    ours = load_checkpoint(tmp_path / "hf")
    assert ours.config == cfg
    theirs = twin.state_dict()
    for key, value in ours.state_dict().items():
        assert torch.equal(value, theirs[key]), key
    ids = random_ids(cfg, 2, 12)
    assert torch.equal(ours(ids), twin(ids).logits)
    assert len(checkpoint_content_hash(tmp_path / "hf")) == 64


def test_heads_load_in_transformers_classification_models(tmp_path):
    cfg = tiny_config()
    ids = random_ids(cfg, 2, 10)
    value = MistralForValueHead(cfg)
    twin = transformers.MistralForSequenceClassification.from_pretrained(save_checkpoint(value, tmp_path / "v"))
    assert twin.config.num_labels == 1
    ref = twin.score(twin.model(ids).last_hidden_state).squeeze(-1)
    assert (value(ids) - ref).abs().max().item() <= 1e-5
    prm = MistralForProcessReward(cfg, num_labels=2)
    torch.nn.init.normal_(prm.score.bias)
    twin = transformers.MistralForTokenClassification.from_pretrained(save_checkpoint(prm, tmp_path / "p")).eval()
    assert (prm(ids) - twin(ids).logits).abs().max().item() <= 1e-5
