"""Oracle: a packed forward of align's Mistral equals transformers' MistralForCausalLM, both run per document
(each document its own batch: the reference needs no packing support) and run packed (transformers 5 detects
packed rows from position_ids that restart, on its sdpa and eager paths, when attention_mask is None and no cache
is used). Logits and gradients, fp32, a sliding window that bites."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from align.model import AttentionConfig, MistralForCausalLM
from align.model.attention import document_positions
from model_helpers import hf_twin, packed_rows, tiny_config

pytestmark = pytest.mark.oracle
transformers = pytest.importorskip("transformers")


def _doc_loss(logits, docs, doc_ids) -> torch.Tensor:
    total = 0.0
    for b, row in enumerate(docs):
        for d, seq in enumerate(row):
            total = total + F.cross_entropy(logits[b][doc_ids[b] == d][:-1].float(), seq[1:], reduction="sum")
    return total


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("impl,window", [("sdpa", None), ("eager", None), ("sdpa", 6)])
def test_packed_forward_equals_transformers_per_document(impl, window):
    torch.manual_seed(7)
    cfg = tiny_config(sliding_window=window, initializer_range=0.1)
    ours = MistralForCausalLM(cfg, AttentionConfig(impl=impl))
    twin = hf_twin(ours)
    twin.config._attn_implementation = impl
    docs, ids, real, doc_ids = packed_rows(cfg)
    logits = ours(ids, real, document_ids=doc_ids)
    _doc_loss(logits, docs, doc_ids).backward()
    ref_loss = 0.0
    for b, row in enumerate(docs):
        for d, seq in enumerate(row):
            ref = twin(seq[None], use_cache=False).logits[0]
            assert (logits[b][doc_ids[b] == d] - ref).abs().max().item() <= 1e-5, (b, d)
            ref_loss = ref_loss + F.cross_entropy(ref[:-1], seq[1:], reduction="sum")
    ref_loss.backward()
    ours_g, ref_g = _grads(ours), _grads(twin)
    for name, g in ours_g.items():
        assert (g - ref_g[name]).abs().max() <= 1e-5 * ref_g[name].abs().max(), name


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_packed_forward_equals_transformers_packed_position_ids(impl):
    torch.manual_seed(8)
    cfg = tiny_config(initializer_range=0.1)
    ours = MistralForCausalLM(cfg, AttentionConfig(impl=impl))
    twin = hf_twin(ours)
    twin.config._attn_implementation = impl
    docs, ids, real, doc_ids = packed_rows(cfg)
    positions = document_positions(doc_ids)  # restarts per document; the padding tail is one more segment
    ref = twin(ids, position_ids=positions, use_cache=False).logits
    logits = ours(ids, real, positions, document_ids=doc_ids)
    assert (logits - ref)[real].abs().max().item() <= 1e-5
    # the reference really packs: without restarting positions its documents see each other
    plain = twin(ids, use_cache=False).logits
    assert (plain - ref)[real].abs().max().item() > 1e-2
