"""Shared builders for the inference and rollout tests: a small random model and the no-cache references."""

from __future__ import annotations

import torch

from align.model import MistralConfig, MistralForCausalLM


def small_model(seed: int = 0, **overrides) -> MistralForCausalLM:
    """A random Mistral small enough that a no-cache reference loop runs in milliseconds per token."""
    base = dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256, rope_theta=10000.0)
    base.update(overrides)
    torch.manual_seed(seed)
    # std 0.1 (not the 0.02 init) spreads the logits, so greedy choices are not decided by float noise.
    model = MistralForCausalLM(MistralConfig(**base)).eval()
    model.init_weights(std=0.1)
    return model


def random_prompts(lengths, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


@torch.no_grad()
def naive_greedy(model, prompt: list[int], max_new_tokens: int, stop: tuple[int, ...] = ()) -> list[int]:
    """The reference: a full forward over the whole sequence for every new token, argmax of the last logits."""
    ids = list(prompt)
    out: list[int] = []
    while len(out) < max_new_tokens and len(ids) < model.config.max_position_embeddings:
        token = int(model(torch.tensor([ids]))[0, -1].argmax())
        out.append(token)
        ids.append(token)
        if token in stop:
            break
    return out


@torch.no_grad()
def full_forward_logits(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """Logits (len(completion), V) fp32 that predicted each completion token, from one forward of the sequence."""
    ids = torch.tensor([list(prompt) + list(completion)])
    return model(ids)[0, len(prompt) - 1:-1].float()
