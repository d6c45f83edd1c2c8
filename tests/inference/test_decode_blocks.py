"""The engine's decode block comes from the family registry (`Family.mlp`), never from a list of family names: every
registered family's decode block is the one its layers' MLP needs, and a family registered here (not in align)
decodes with no edit to the inference layer."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from align.inference import EngineConfig
from align.inference.dense_decode import DenseMlp
from align.inference.fused_layers import DECODE_BLOCKS, decode_block
from align.inference.sparse_decode import SparseMlp
from align.model.family import FAMILIES, MLP_KINDS, Family
from align.model.layers import MistralMLP
from align.model.mistral import MistralForCausalLM
from align.model.moe import SparseMoeBlock
from align.model.olmoe import OlmoeForCausalLM
from inference_helpers import assert_greedy_and_logprob_contracts, small_model

SHAPE = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
             num_key_value_heads=1, max_position_embeddings=64)
BLOCK_OF_MLP = {MistralMLP: DenseMlp, SparseMoeBlock: SparseMlp}  # what each model MLP's decode must run


def test_every_mlp_kind_has_a_decode_block():
    assert set(DECODE_BLOCKS) == set(MLP_KINDS)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_registered_family_decodes_its_own_mlp(name):
    family = FAMILIES[name]
    model = family.causal_lm(family.spec.cls(**SHAPE))
    assert decode_block(model) is BLOCK_OF_MLP[type(model.model.layers[0].mlp)]


class ToyForCausalLM(MistralForCausalLM):
    hf_architecture = "ToyForCausalLM"


class ToyMoeForCausalLM(OlmoeForCausalLM):
    hf_architecture = "ToyMoeForCausalLM"


def _register(monkeypatch, base: str, name: str, cls: type, **fields) -> Family:
    family = dataclasses.replace(FAMILIES[base], name=name, models=(cls,), **fields)
    monkeypatch.setitem(FAMILIES, name, family)
    return family


def test_a_new_dense_family_decodes_without_touching_the_engine(monkeypatch):
    _register(monkeypatch, "mistral", "toy", ToyForCausalLM)  # mlp left at its default: "dense"
    model = ToyForCausalLM(small_model().config).eval()
    model.load_state_dict(small_model().state_dict())
    assert decode_block(model) is DenseMlp
    assert_greedy_and_logprob_contracts(model, EngineConfig(block_size=8, num_blocks=32, max_num_seqs=2,
                                                            max_num_batched_tokens=16))


def test_a_new_sparse_family_opts_in(monkeypatch):
    _register(monkeypatch, "olmoe", "toy_moe", ToyMoeForCausalLM)
    torch.manual_seed(0)
    model = ToyMoeForCausalLM(FAMILIES["olmoe"].spec.cls(**SHAPE)).eval()
    assert decode_block(model) is SparseMlp
    _register(monkeypatch, "olmoe", "toy_moe", ToyMoeForCausalLM, mlp="dense")  # a wrong registration shows
    assert decode_block(model) is DenseMlp


def test_an_unknown_mlp_kind_is_refused_at_registration():
    with pytest.raises(ValueError, match=r"'toy': mlp is 'moe'"):
        dataclasses.replace(FAMILIES["mistral"], name="toy", mlp="moe")
