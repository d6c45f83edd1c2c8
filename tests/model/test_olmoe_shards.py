"""OLMoE checkpoints in several shards, as the hub's OLMoE-1B-7B is stored: a layer's experts split across files
still load (load_checkpoint's streaming into views of the fused parameters, and the Trainer's WeightFormat.read
that fuses a stream of file tensors), bitwise; transformers reads align's sharded save (oracle tier)."""

from __future__ import annotations

import json

import pytest
import torch

from align.model.checkpoint import load_checkpoint, save_checkpoint
from align.model.olmoe import OlmoeForCausalLM
from align.model.safetensors_io import INDEX_FILE
from align.train.ckpt_format import weight_format_for
from moe_helpers import random_ids, tiny_olmoe


def sharded(tmp_path, max_shard_bytes: int = 65536):  # ~3 shards per layer of experts
    torch.manual_seed(11)
    ours = OlmoeForCausalLM(tiny_olmoe(num_experts=8)).eval()
    out = save_checkpoint(ours, tmp_path / "c", max_shard_bytes=max_shard_bytes)
    index = json.loads((out / INDEX_FILE).read_text())["weight_map"]
    return ours, out, index


def split_layers(index: dict) -> list[str]:
    """Layers whose expert tensors sit in more than one shard."""
    files: dict[str, set[str]] = {}
    for key, name in index.items():
        if ".mlp.experts." in key:
            files.setdefault(key.split(".mlp.experts.")[0], set()).add(name)
    return [layer for layer, names in files.items() if len(names) > 1]


def test_experts_split_across_shards_load_bitwise(tmp_path):
    ours, ckpt, index = sharded(tmp_path)
    assert len(set(index.values())) > 2 and split_layers(index)  # the case under test really occurs
    back = load_checkpoint(ckpt)
    for (k, a), (_, b) in zip(ours.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a, b), k
    ids = random_ids(ours.config, 2, 9)
    assert torch.equal(ours(ids), back(ids))


def test_trainer_format_reads_sharded_experts(tmp_path):
    ours, ckpt, index = sharded(tmp_path)
    assert split_layers(index)
    pairs = dict(weight_format_for(ours).read(ours, ckpt))
    state = ours.state_dict()
    assert set(pairs) == set(state)
    for k, t in state.items():
        assert torch.equal(pairs[k], t), k


@pytest.mark.oracle
def test_transformers_loads_align_sharded_save(tmp_path):
    transformers = pytest.importorskip("transformers")
    ours, ckpt, _ = sharded(tmp_path)
    twin = transformers.OlmoeForCausalLM.from_pretrained(ckpt).eval()
    ids = random_ids(ours.config, 2, 9)
    ref = twin(ids).logits
    assert (ours(ids) - ref).abs().max().item() <= 1e-5 * max(1.0, ref.abs().max().item())
