"""Packed SFT batches from real shards through the real model and loss: every document's logits, its summed loss
and the gradients equal those of the documents run one by one (unpacked, one row each), in fp32."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from align.data.collate import collate
from align.data.loader import BatchLoader, LoaderConfig
from align.data.store import ShardSet
from align.model import MistralConfig, MistralForCausalLM
from align.model.attention import AttentionConfig
from align.train.sft_loss import SftLossConfig, sft_loss


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _model(impl: str = "sdpa", **kw) -> MistralForCausalLM:
    torch.manual_seed(0)
    cfg = MistralConfig(vocab_size=32768, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0,
                        initializer_range=0.1, **kw)
    return MistralForCausalLM(cfg, AttentionConfig(impl=impl))


def _packed_micro_batch(shards, packing):
    loader = BatchLoader(shards, LoaderConfig(micro_batch_size=2, packing=packing, seq_len=160), 11)
    mb = next(iter(loader)).micro_batches[0]
    assert int(mb["document_ids"].max()) >= 2  # at least three documents share a row
    return mb


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("packing,fused,impl", [("ffd", True, "sdpa"), ("greedy", False, "eager")])
def test_packed_loss_and_gradients_equal_documents_alone(shard_sets, packing, fused, impl):
    shards = ShardSet.open(shard_sets["sft"])
    mb = _packed_micro_batch(shards, packing)
    model = _model(impl)
    cfg = SftLossConfig(fused=fused, chunk_size=64)
    out = sft_loss(model, mb, cfg)
    out.loss.backward()
    packed_grads, packed_tokens = _grads(model), float(out.sums["tokens"])
    model.zero_grad(set_to_none=True)
    alone_loss, alone_tokens = 0.0, 0.0
    for row in mb["row_index"].tolist():
        single = collate(shards, np.array([row]))
        res = sft_loss(model, single, cfg)
        res.loss.backward()
        alone_loss += float(res.loss.detach())
        alone_tokens += float(res.sums["tokens"])
    assert packed_tokens == alone_tokens > 0
    assert abs(float(out.loss.detach()) - alone_loss) <= 1e-5 * alone_loss
    alone_grads = _grads(model)
    assert packed_grads.keys() == alone_grads.keys()
    for name, g in alone_grads.items():
        assert (packed_grads[name] - g).abs().max() <= 1e-5 * g.abs().max(), name


def test_packed_logits_equal_each_document_alone(shard_sets):
    shards = ShardSet.open(shard_sets["sft"])
    mb = _packed_micro_batch(shards, "ffd")
    model = _model(sliding_window=24)  # a window that bites inside documents: it counts document positions
    with torch.no_grad():
        logits = model(mb["input_ids"], mb["attention_mask"], mb["position_ids"],
                       document_ids=mb["document_ids"])  # (B, T, V)
        rows, i = mb["row_index"].tolist(), 0
        for b in range(logits.shape[0]):
            for d in range(int(mb["document_ids"][b].max()) + 1):
                ids, _ = shards.sequence(rows[i])
                alone = model(torch.from_numpy(ids)[None])[0]  # (n, V)
                here = logits[b][mb["document_ids"][b] == d]
                assert torch.allclose(here, alone, rtol=0, atol=2e-5), (b, d)
                i += 1
