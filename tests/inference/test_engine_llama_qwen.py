"""The engine runs Llama 3 (scaled RoPE), Qwen 2 (q/k/v biases in the fused product) and Qwen 3 (per-head QK-norm
before RoPE) through the paged KV cache: greedy tokens equal the no-cache argmax loop of the model's own forward
and their log-probs a full forward, on each linear kernel and both attention kernels (the C one where it builds,
torch's otherwise); a shared prefix is served from the cache with the same tokens; a weight update (biases and
q/k norms included) reaches the engine; LoRA adapters decode on the biased projections."""

from __future__ import annotations

import pytest
import torch

from align.inference import Engine, EngineConfig, GenerationRequest, SamplingParams
from align.lora.adapters import LoraConfig, apply_lora
from dense_helpers import dense_model  # tests/model's builders (conftest puts them on the path)
from inference_helpers import assert_greedy_and_logprob_contracts, naive_greedy, random_prompts

FAMILIES = ("llama", "qwen2", "qwen3")
CONFIG = dict(block_size=8, num_blocks=64, max_num_seqs=3, max_num_batched_tokens=24)


def model_of(family: str, seed: int = 0, **overrides):
    # max_position_embeddings past llama3's original length (64) in the test shape: prompts reach the scaled band
    return dense_model(family, seed=seed, max_position_embeddings=256, **overrides)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kernel", ["torch", "native"])
@pytest.mark.parametrize("cpu_kernels", ["torch", "native"])
def test_greedy_and_logprobs_equal_the_model(family, kernel, cpu_kernels):
    """cpu_kernels "native": the C paged attention, and on fp32 the C RoPE + KV write fed by the fused product
    (biases and the per-head QK-norm applied before it); blocks of 16, the C kernel's granularity."""
    config = EngineConfig(**{**CONFIG, "block_size": 16, "num_blocks": 32}, linear_kernel=kernel,
                          cpu_kernels=cpu_kernels)
    assert_greedy_and_logprob_contracts(model_of(family), config)


@pytest.mark.parametrize("family", FAMILIES)
def test_shapes_the_c_attention_cannot_take_fall_back_to_torch(family):
    """head_dim 24 (not a multiple of 16): "auto" runs torch's paged attention, with the same contracts."""
    model = model_of(family, seed=3, **({"hidden_size": 96, "num_attention_heads": 4} if family != "qwen3"
                                        else {"head_dim": 24}))
    assert model.config.head_dim == 24
    config = EngineConfig(**{**CONFIG, "block_size": 16, "num_blocks": 32}, cpu_kernels="auto")
    assert Engine(model, config).runner.cpu_kernels == "torch"
    assert_greedy_and_logprob_contracts(model, config)


@pytest.mark.parametrize("family", FAMILIES)
def test_gqa_one_kv_head_and_tied_head(family):
    model = model_of(family, seed=2, num_key_value_heads=1, tie_word_embeddings=True)
    assert_greedy_and_logprob_contracts(model, EngineConfig(**CONFIG))


@pytest.mark.parametrize("family", FAMILIES)
def test_shared_prefix_decodes_the_same(family):
    model = model_of(family, seed=4)
    prefix = random_prompts([40], model.config.vocab_size, seed=5)[0]
    prompts = [prefix + tail for tail in random_prompts([3, 6], model.config.vocab_size, seed=6)]
    engine = Engine(model, EngineConfig(block_size=8, num_blocks=64, enable_prefix_caching=True))
    params = SamplingParams(0.0, max_new_tokens=10)
    first = engine.generate([GenerationRequest(prompts[0], params)])[0].token_ids
    second = engine.generate([GenerationRequest(p, params) for p in prompts])
    assert engine.block_manager.num_cached_tokens >= 40 - 40 % 8  # the prefix came from the cache
    assert first == second[0].token_ids
    for p, r in zip(prompts, second):
        assert r.token_ids == naive_greedy(model, p, 10)


@pytest.mark.parametrize("family", FAMILIES)
def test_weight_update_reaches_biases_and_norms(family):
    model = model_of(family)
    engine = Engine(model, EngineConfig(block_size=8, num_blocks=32))
    prompt = random_prompts([9], model.config.vocab_size, seed=3)[0]
    req = [GenerationRequest(prompt, SamplingParams(0.0, max_new_tokens=8))]
    before = engine.generate(req)[0].token_ids
    other = model_of(family, seed=9)
    engine.load_weights(other.state_dict())
    after = engine.generate(req)[0].token_ids
    assert after == naive_greedy(other, prompt, 8) and after != before


@pytest.mark.parametrize("family", FAMILIES)
def test_lora_adapters_decode(family):
    model = apply_lora(model_of(family, seed=6), LoraConfig(rank=4, alpha=8.0))
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    prompts = random_prompts([5, 21], model.config.vocab_size, seed=7)
    results = Engine(model, EngineConfig(block_size=8, num_blocks=64)).generate(
        [GenerationRequest(p, SamplingParams(0.0, max_new_tokens=8)) for p in prompts])
    for p, r in zip(prompts, results):
        assert r.token_ids == naive_greedy(model, p, 8)
