"""Shared builders for the inference and rollout tests: a small random model and the no-cache references."""

from __future__ import annotations

import torch

from align.inference import Engine, EngineConfig, GenerationRequest, SamplingParams
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


def assert_greedy_and_logprob_contracts(model, config: EngineConfig) -> None:
    """Greedy tokens equal the no-cache argmax loop, and their log-probs a full forward within 1e-5, for a mixed
    batch (prompt lengths 3-40, three running at once, a 24-token budget: chunked prefill, joining mid-flight)."""
    prompts = random_prompts([3, 17, 40, 9, 26], model.config.vocab_size, seed=1)
    results = Engine(model, config).generate([GenerationRequest(p, SamplingParams(0.0, max_new_tokens=12))
                                              for p in prompts])
    for p, r in zip(prompts, results):
        assert r.token_ids == naive_greedy(model, p, 12)
        ref = full_forward_logits(model, p, r.token_ids).log_softmax(-1)
        ref = ref.gather(1, torch.tensor(r.token_ids)[:, None]).squeeze(1)
        torch.testing.assert_close(torch.tensor(r.model_logprobs), ref, atol=1e-5, rtol=0)


def assert_batch_invariant(model, **engine_kwargs) -> None:
    """Tokens and both log-probs of every request are bitwise the same alone as in batches of other requests,
    reversed, with small token budgets (chunked prefill), few running sequences, preemption with recompute and a
    prompt shared through the prefix cache."""
    prompts = random_prompts([13, 40, 7, 29, 3, 18, 32, 32], model.config.vocab_size, seed=14)
    prompts[7] = prompts[6]  # two requests with one prompt: the second shares the first's blocks
    params = [SamplingParams(0.0, max_new_tokens=16), SamplingParams(0.8, top_k=30, top_p=0.9, max_new_tokens=16)]
    reqs = [GenerationRequest(p, params[i % 2], seed=i) for i, p in enumerate(prompts)]
    alone = [Engine(model, EngineConfig(**engine_kwargs)).generate([r])[0] for r in reqs]
    variants = [{}, dict(max_num_batched_tokens=24), dict(max_num_seqs=3),
                dict(num_blocks=10, enable_prefix_caching=False)]
    for extra in variants:
        engine = Engine(model, EngineConfig(**engine_kwargs, **extra))
        batch = engine.generate(reqs[::-1])[::-1]
        for a, b in zip(alone, batch):
            assert (a.token_ids, a.logprobs, a.model_logprobs) == (b.token_ids, b.logprobs, b.model_logprobs), extra
    assert engine.stats.preemptions > 0
