"""Shared builders for tests/train: a tiny Mistral, synthetic SFT batches, an in-memory resumable loader."""

from __future__ import annotations

import torch

from align.model import MistralConfig, MistralForCausalLM


def tiny_config(**overrides) -> MistralConfig:
    base = dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=128, rope_theta=10000.0)
    base.update(overrides)
    return MistralConfig(**base)


def tiny_model(seed: int = 0, **overrides) -> MistralForCausalLM:
    torch.manual_seed(seed)
    return MistralForCausalLM(tiny_config(**overrides))


def sft_batch(b: int, t: int, vocab: int = 256, seed: int = 0) -> dict:
    """Right-padded rows with a masked prompt and a labelled answer of varying lengths."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (b, t), generator=g)
    lens = torch.randint(4, t + 1, (b,), generator=g)
    prompt = torch.randint(1, 4, (b,), generator=g)
    pos = torch.arange(t)[None]
    mask = pos < lens[:, None]
    labels = torch.where(mask & (pos >= prompt[:, None]), ids, torch.full_like(ids, -100))
    return {"input_ids": torch.where(mask, ids, torch.zeros_like(ids)), "labels": labels, "attention_mask": mask}


def split_rows(batch: dict, parts: int) -> list[dict]:
    n = batch["input_ids"].shape[0] // parts
    return [{k: v[i * n:(i + 1) * n] for k, v in batch.items()} for i in range(parts)]


class ListLoader:
    """Yields pre-built batches in order, forever (epoch after epoch); state = position, as the real loader's."""

    def __init__(self, batches: list[dict]):
        self.batches = batches
        self.pos = 0

    def __iter__(self):
        while True:
            batch = self.batches[self.pos % len(self.batches)]
            self.pos += 1
            yield batch

    def state_dict(self) -> dict:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.pos = int(state["pos"])
