"""Shared builders for the model tests: tiny configs and the matching transformers model (oracle tier only)."""

from __future__ import annotations

import dataclasses

import torch

from align.model import MistralConfig


def tiny_config(**overrides) -> MistralConfig:
    base = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256, rope_theta=10000.0, rms_norm_eps=1e-6)
    base.update(overrides)
    return MistralConfig(**base)


def hf_config(cfg: MistralConfig):
    """The transformers MistralConfig with the same architecture (transformers 5 rope spelling)."""
    import transformers

    fields = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "rope_theta"}
    return transformers.MistralConfig(**fields, rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta})


def hf_twin(model, cls_name: str = "MistralForCausalLM", **config_kwargs):
    """A transformers model holding exactly `model`'s weights, in eval mode, eager or sdpa attention."""
    import transformers

    hcfg = hf_config(model.config)
    for k, v in config_kwargs.items():
        setattr(hcfg, k, v)
    twin = getattr(transformers, cls_name)(hcfg).eval()
    missing, unexpected = twin.load_state_dict(model.state_dict(), strict=False)
    assert not unexpected and not [k for k in missing if k != "lm_head.weight"], (missing, unexpected)
    return twin


def random_ids(cfg: MistralConfig, b: int, t: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.vocab_size, (b, t), generator=g)


def packed_rows(cfg, lengths=((5, 9, 3), (7, 11), (17,)), t: int = 20, seed: int = 0):
    """Random documents laid out as align.data.collate_packed does: (docs, ids, attention_mask, document_ids)."""
    g = torch.Generator().manual_seed(seed)
    docs = [[torch.randint(1, cfg.vocab_size, (n,), generator=g) for n in row] for row in lengths]
    ids = torch.zeros(len(lengths), t, dtype=torch.int64)
    doc_ids = torch.full((len(lengths), t), -1, dtype=torch.int64)
    for b, row in enumerate(docs):
        start = 0
        for d, seq in enumerate(row):
            ids[b, start:start + len(seq)], doc_ids[b, start:start + len(seq)] = seq, d
            start += len(seq)
    return docs, ids, doc_ids >= 0, doc_ids
