"""Packed rows in the model: the block-diagonal causal mask, positions that restart per document, and a packed
forward/backward equal to running each document alone (sdpa and eager, GQA, a sliding window that bites)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from align.model import MistralForCausalLM
from align.model.attention import AttentionConfig, build_mask, document_mask, document_positions
from model_helpers import packed_rows, tiny_config

T = 20  # packed_rows' default row width


def test_document_positions_restart_at_every_document():
    doc = torch.tensor([[0, 0, 0, 1, 1, 2, -1, -1], [0, 0, 0, 0, 0, 0, 0, 0]])
    assert document_positions(doc).tolist() == [[0, 1, 2, 0, 1, 0, 0, 1], list(range(8))]


@pytest.mark.parametrize("window", [None, 3])
def test_document_mask_is_block_diagonal_causal(window):
    doc = torch.tensor([[0, 0, 0, 1, 1, 1, 1, -1, -1]])
    real = doc >= 0
    mask = document_mask(doc, real, window)[0, 0]
    for q in range(9):
        for k in range(9):
            same = doc[0, q] == doc[0, k]
            want = bool(k <= q and same and (window is None or k > q - window) and (real[0, k] or k == q))
            assert bool(mask[q, k]) == want, (q, k)
    assert mask.any(dim=-1).all()  # no query without a key (padding keeps its own)


def test_unpacked_batches_still_build_no_mask():
    # the fast path of an unpacked, unpadded batch is untouched: no mask tensor, SDPA is_causal
    assert build_mask(torch.ones(2, 8, dtype=torch.bool), 8, None) is None
    assert build_mask(None, 8, 16) is None


@pytest.mark.parametrize("impl,kv_heads,window", [("sdpa", 2, None), ("eager", 1, None), ("sdpa", 4, 6),
                                                  ("eager", 2, 6)])
def test_packed_logits_and_gradients_equal_documents_alone(impl, kv_heads, window):
    torch.manual_seed(1)
    cfg = tiny_config(num_key_value_heads=kv_heads, sliding_window=window, initializer_range=0.1)
    model = MistralForCausalLM(cfg, AttentionConfig(impl=impl))
    docs, ids, real, doc_ids = packed_rows(cfg)
    logits = model(ids, real, document_ids=doc_ids)  # positions derived from document_ids
    packed_loss = 0.0
    for b, row in enumerate(docs):
        for d, seq in enumerate(row):
            here = logits[b][doc_ids[b] == d]
            packed_loss = packed_loss + F.cross_entropy(here[:-1], seq[1:], reduction="sum")
    packed_loss.backward()
    packed = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    alone_loss = 0.0
    for b, row in enumerate(docs):
        for d, seq in enumerate(row):
            alone = model(seq[None])[0]  # (n, V): the document as its own batch, nothing else in sight
            assert torch.allclose(logits[b][doc_ids[b] == d], alone, rtol=0, atol=1e-5), (b, d)
            alone_loss = alone_loss + F.cross_entropy(alone[:-1], seq[1:], reduction="sum")
    alone_loss.backward()
    assert abs(packed_loss.item() - alone_loss.item()) <= 1e-5 * alone_loss.item()
    for name, p in model.named_parameters():
        # measured: max |diff| / max |grad| <= 7.2e-7 on every tensor (fp32 summation order only)
        assert (packed[name] - p.grad).abs().max() <= 1e-5 * p.grad.abs().max(), name


def test_one_document_per_row_matches_the_unpacked_forward():
    torch.manual_seed(2)
    cfg = tiny_config()
    model = MistralForCausalLM(cfg)
    _, ids, real, doc_ids = packed_rows(cfg, [[20], [20]])
    with torch.no_grad():
        assert torch.allclose(model(ids, document_ids=doc_ids), model(ids), rtol=0, atol=1e-5)


def test_document_ids_with_a_kv_cache_are_refused():
    cfg = tiny_config()
    model = MistralForCausalLM(cfg)
    _, ids, real, doc_ids = packed_rows(cfg)
    with pytest.raises(ValueError, match="document_ids .* not with a kv_cache"):
        model(ids, real, kv_cache=model.new_kv_cache(3, T), document_ids=doc_ids)
