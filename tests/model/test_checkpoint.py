"""align.model.checkpoint without oracle libraries: round trips, sharding, atomic publication, content hash,
snapshot layout, tokenizer fallback, and a clear error for each kind of bad input."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

import align.model.checkpoint as ckpt_mod
from align.exceptions import CheckpointError
from align.model import MistralForCausalLM, MistralForProcessReward, MistralForValueHead, save_hf_config
from align.model.checkpoint import (
    checkpoint_content_hash,
    load_checkpoint,
    load_weights_into,
    save_checkpoint,
    tokenizer_dir_for,
)
from align.model.safetensors_io import INDEX_FILE, WEIGHTS_FILE
from align.utils.manifest import read_manifest
from model_helpers import random_ids, tiny_config


def assert_same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("shard", [None, 20_000])
def test_round_trip_bitwise(tmp_path, tied, shard):
    model = MistralForCausalLM(tiny_config(tie_word_embeddings=tied))
    out = save_checkpoint(model, tmp_path / "ck", max_shard_bytes=shard)
    files = sorted(os.listdir(out))
    assert ("model-00001-of-" in " ".join(files)) == (shard is not None)
    assert (INDEX_FILE in files) == (shard is not None) and (WEIGHTS_FILE in files) == (shard is None)
    assert not [f for f in os.listdir(tmp_path) if ".partial-" in f]
    manifest = read_manifest(out, kind="hf_checkpoint", verify_hashes=True)
    assert set(manifest["files"]) == set(files) - {"manifest.json"}
    loaded = load_checkpoint(out)
    assert loaded.config == model.config
    assert_same_weights(loaded, model)
    if tied:
        assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
        assert "lm_head.weight" not in json.dumps(files) and "lm_head.weight" not in _all_keys(out)


def _all_keys(directory):
    keys = set()
    for f in os.listdir(directory):
        if f.endswith(".safetensors"):
            keys |= set(load_file(directory / f))
    return keys


def test_content_hash_is_layout_independent_and_content_sensitive(tmp_path):
    model = MistralForCausalLM(tiny_config())
    a = save_checkpoint(model, tmp_path / "a")
    b = save_checkpoint(model, tmp_path / "b", max_shard_bytes=30_000)
    ha = checkpoint_content_hash(a)
    assert ha == checkpoint_content_hash(b) == checkpoint_content_hash(a, recompute=True)
    with torch.no_grad():
        model.model.norm.weight[0] += 1e-3
    assert checkpoint_content_hash(save_checkpoint(model, tmp_path / "c")) != ha
    assert checkpoint_content_hash(save_checkpoint(model, tmp_path / "d", dtype=torch.bfloat16)) != ha


def test_bf16_save_and_dtype_cast_on_load(tmp_path):
    model = MistralForCausalLM(tiny_config())
    out = save_checkpoint(model, tmp_path / "ck", dtype=torch.bfloat16)
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    assert all(t.dtype == torch.bfloat16 for t in load_file(out / WEIGHTS_FILE).values())
    loaded = load_checkpoint(out, dtype=torch.float32)
    assert loaded.lm_head.weight.dtype == torch.float32
    assert torch.equal(loaded.lm_head.weight, model.lm_head.weight.bfloat16().float())
    assert load_checkpoint(out, dtype=torch.bfloat16).model.norm.weight.dtype == torch.bfloat16


def test_heads_round_trip_and_value_model_from_policy(tmp_path):
    cfg = tiny_config()
    prm = MistralForProcessReward(cfg, num_labels=3)
    loaded = load_checkpoint(save_checkpoint(prm, tmp_path / "prm"), cls=MistralForProcessReward)
    assert loaded.num_labels == 3
    assert_same_weights(loaded, prm)
    value = MistralForValueHead(cfg)
    assert_same_weights(load_checkpoint(save_checkpoint(value, tmp_path / "v"), cls=MistralForValueHead), value)
    policy_dir = save_checkpoint(MistralForCausalLM(cfg), tmp_path / "policy")
    critic = MistralForValueHead(cfg)
    with pytest.raises(CheckpointError, match="score.weight"):
        load_weights_into(critic, policy_dir)
    load_weights_into(critic, policy_dir, ignore_missing=("score.",), ignore_unexpected=("lm_head.",))
    policy = load_checkpoint(policy_dir)
    assert torch.equal(critic.model.layers[1].mlp.up_proj.weight, policy.model.layers[1].mlp.up_proj.weight)


def test_failed_save_leaves_nothing_and_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    model = MistralForCausalLM(tiny_config())
    out = save_checkpoint(model, tmp_path / "ck")
    before = checkpoint_content_hash(out)

    def boom(*a, **k):
        raise OSError("disk full (injected)")

    monkeypatch.setattr(ckpt_mod, "write_manifest", boom)
    with torch.no_grad():
        model.model.norm.weight.add_(1.0)
    with pytest.raises(OSError, match="injected"):
        save_checkpoint(model, tmp_path / "ck")
    assert sorted(os.listdir(tmp_path)) == ["ck"]
    assert checkpoint_content_hash(out, recompute=True) == before
    with pytest.raises(OSError):
        save_checkpoint(model, tmp_path / "new")
    assert not (tmp_path / "new").exists()


def test_hub_snapshot_layout_with_symlinks(tmp_path):
    src = save_checkpoint(MistralForCausalLM(tiny_config()), tmp_path / "src")
    root = tmp_path / "models--org--tiny"
    snap = root / "snapshots" / "abc123"
    (root / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text("abc123")
    for name in ("config.json", WEIGHTS_FILE):
        (root / "blobs" / name).write_bytes((src / name).read_bytes())
        (snap / name).symlink_to(root / "blobs" / name)
    assert_same_weights(load_checkpoint(root), load_checkpoint(src))
    assert checkpoint_content_hash(root) == checkpoint_content_hash(src)


def test_tokenizer_fallback(tmp_path):
    vendored = ckpt_mod.Path(__file__).resolve().parents[2] / "assets" / "tokenizer" / "mistral-7b-v0.3"
    small = save_checkpoint(MistralForCausalLM(tiny_config()), tmp_path / "small")
    with pytest.raises(CheckpointError, match="vocab_size 128"):
        tokenizer_dir_for(small)
    full_vocab = save_checkpoint(MistralForCausalLM(tiny_config(vocab_size=32768, num_hidden_layers=1)),
                                 tmp_path / "v3")
    assert tokenizer_dir_for(full_vocab) is None  # the vendored Mistral v0.3 copy
    if not (vendored / "tokenizer.json").is_file():
        pytest.skip("vendored tokenizer not in this checkout")
    with_tok = save_checkpoint(MistralForCausalLM(tiny_config()), tmp_path / "tok", tokenizer_dir=vendored)
    assert tokenizer_dir_for(with_tok) == with_tok
    assert (with_tok / "tokenizer.json").read_bytes() == (vendored / "tokenizer.json").read_bytes()
    tok = ckpt_mod.load_tokenizer(with_tok)
    assert tok.vocab_size == 32768


# ---- bad input: one clear error naming the file and key --------------------------------------------------------

@pytest.fixture
def saved(tmp_path):
    model = MistralForCausalLM(tiny_config())
    return model, save_checkpoint(model, tmp_path / "ck")


def test_truncated_weights_named(saved, tmp_path):
    _, out = saved
    path = out / WEIGHTS_FILE
    path.write_bytes(path.read_bytes()[:-1000])
    with pytest.raises(CheckpointError, match="model.safetensors.*bytes"):  # the manifest's size check
        load_checkpoint(out)
    (out / "manifest.json").unlink()  # as a hub snapshot: safetensors itself refuses the file
    with pytest.raises(CheckpointError, match="model.safetensors.*truncated"):
        load_checkpoint(out)


def test_wrong_shapes_named(saved):
    model, out = saved
    (out / "manifest.json").unlink()  # else the manifest's size check refuses the edited config first
    cfg = json.loads((out / "config.json").read_text())
    cfg["intermediate_size"] = 80
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"mlp.gate_proj.weight has shape \[96, 64\], model expects \[80, 64\]"):
        load_checkpoint(out)


def test_missing_and_unexpected_keys_all_named(saved):
    model, out = saved
    (out / "manifest.json").unlink()
    tensors = load_file(out / WEIGHTS_FILE)
    del tensors["model.layers.1.self_attn.v_proj.weight"], tensors["model.norm.weight"]
    tensors["model.layers.9.extra.weight"] = torch.zeros(2)
    save_file(tensors, out / WEIGHTS_FILE, metadata={"format": "pt"})
    with pytest.raises(CheckpointError) as err:
        load_weights_into(model, out)
    msg = str(err.value)
    assert "model.layers.1.self_attn.v_proj.weight" in msg and "model.norm.weight" in msg
    assert "model.layers.9.extra.weight (in model.safetensors)" in msg


def test_integer_tensor_refused(saved):
    model, out = saved
    (out / "manifest.json").unlink()
    tensors = load_file(out / WEIGHTS_FILE)
    tensors["model.norm.weight"] = torch.ones(64, dtype=torch.int32)
    save_file(tensors, out / WEIGHTS_FILE, metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="model.norm.weight has dtype I32"):
        load_weights_into(model, out)


def test_unsupported_config_field_named(saved):
    _, out = saved
    cfg = json.loads((out / "config.json").read_text())
    cfg["rope_scaling"] = {"type": "dynamic", "factor": 2.0}
    (out / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="config.json.*rope_scaling"):
        load_checkpoint(out)


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nope")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(CheckpointError, match="not a directory"):
        load_checkpoint(tmp_path / "file.txt")
    with pytest.raises(CheckpointError, match="no config.json"):
        load_checkpoint(tmp_path)
    save_hf_config(tiny_config(), tmp_path)
    with pytest.raises(CheckpointError, match="no model.safetensors or model.safetensors.index.json"):
        load_checkpoint(tmp_path)


def test_sharded_index_problems_named(tmp_path):
    out = save_checkpoint(MistralForCausalLM(tiny_config()), tmp_path / "ck", max_shard_bytes=30_000)
    (out / "manifest.json").unlink()
    index = json.loads((out / INDEX_FILE).read_text())
    index["weight_map"]["model.norm.weight"] = "model-00001-of-00099.safetensors"
    (out / INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="model-00001-of-00099.safetensors: listed in .*index.json but missing"):
        load_checkpoint(out)
    first = sorted(p for p in os.listdir(out) if p.startswith("model-0"))[0]
    index["weight_map"]["model.norm.weight"] = first
    (out / INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=f"{first}: key 'model.norm.weight' is in the index but not in the file"):
        load_checkpoint(out)
    (out / INDEX_FILE).write_text("{}")
    with pytest.raises(CheckpointError, match="unreadable index"):
        load_checkpoint(out)


def test_loaded_model_predicts_like_the_saved_one(saved):
    model, out = saved
    ids = random_ids(model.config, 2, 9)
    assert torch.equal(load_checkpoint(out)(ids), model(ids))
