"""align.model.roundtrip: a published checkpoint reproduces its model bit for bit, and a corrupted one is caught."""

from __future__ import annotations

import pytest
import torch

from align.model.roundtrip import RoundtripError, check_published, roundtrip
from align.model import MistralConfig, MistralForCausalLM
from align.model.checkpoint import checkpoint_content_hash, save_checkpoint
from eval_fixtures import TINY, random_model


@pytest.mark.parametrize("tied", [False, True])
def test_roundtrip_of_a_model_is_exact(tmp_path, tied):
    torch.manual_seed(1)
    model = MistralForCausalLM(MistralConfig(**TINY, tie_word_embeddings=tied))
    report = roundtrip(model, tmp_path)
    assert report["forward_equal"] and report["tensors"] == len(model.state_dict())
    assert not (tmp_path / "roundtrip").exists()  # the scratch copy is removed
    published = save_checkpoint(model, tmp_path / "ckpt")
    assert check_published(model, published)["content_hash"] == checkpoint_content_hash(published)


def test_bfloat16_roundtrip_is_exact(tmp_path):
    model = random_model().to(torch.bfloat16)
    assert roundtrip(model, tmp_path)["forward_equal"]


def test_a_weight_that_differs_from_the_published_one_is_named(tmp_path):
    model = random_model()
    published = save_checkpoint(model, tmp_path / "ckpt")
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight[3, 5] += 1e-6  # what a lossy save would leave behind
    with pytest.raises(RoundtripError, match=r"model\.layers\.0\.mlp\.up_proj\.weight differs"):
        check_published(model, published)


def test_a_checkpoint_of_another_shape_is_refused(tmp_path):
    published = save_checkpoint(random_model(), tmp_path / "ckpt")
    other = MistralForCausalLM(MistralConfig(**{**TINY, "num_hidden_layers": 2}, tie_word_embeddings=False))
    with pytest.raises(RoundtripError, match="keys differ"):
        check_published(other, published)
