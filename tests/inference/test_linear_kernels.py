"""The engine's matmul kernels (EngineConfig.linear_kernel: "auto", the default, picks oneDNN's pre-packed weights
on a CPU and the model's own F.linear elsewhere) and bf16 models: the same contracts on every kernel (greedy = the
no-cache loop, log-probs = a full forward, bitwise batch invariance, weights followed), and a clear error where a
chosen kernel cannot run."""

from __future__ import annotations

import copy

import pytest
import torch

from align.inference import Engine, EngineConfig, GenerationRequest, SamplingParams
from align.inference.product_kernels import native_unsupported, onednn_can_run
from inference_helpers import (assert_batch_invariant, assert_greedy_and_logprob_contracts, full_forward_logits,
                               naive_greedy, random_prompts, small_model)

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")
ONEDNN = EngineConfig(linear_kernel="onednn")
# oneDNN's bf16 path needs AVX-512 (BW/VL/DQ) or AVX-NE-CONVERT: an AVX2-only host (e.g. AMD Zen 3) has none
ONEDNN_BF16 = onednn_can_run(torch.ones(1, dtype=torch.bfloat16))
needs_onednn_bf16 = pytest.mark.skipif(not ONEDNN_BF16, reason="oneDNN has no bf16 path on this CPU")
BF16_KERNEL = ONEDNN if ONEDNN_BF16 else EngineConfig(linear_kernel="torch")  # what "auto" picks for bf16


@pytest.fixture(scope="module")
def model():
    return small_model()


def test_onednn_greedy_matches_the_naive_loop_and_logprobs_a_full_forward(model):
    assert_greedy_and_logprob_contracts(model, EngineConfig(linear_kernel="onednn", block_size=8, max_num_seqs=3,
                                                            max_num_batched_tokens=24))


@torch.no_grad()
def test_onednn_head_agrees_with_the_model_kernel_up_to_the_last_bits():
    # Same fp32 arithmetic, possibly another summation blocking. At hidden 256 (the tiny profile's) the two differed
    # by ~1e-6 on an AMD EPYC host and agreed bitwise on an Intel Sapphire Rapids host, so only the bound is a
    # contract.
    model = small_model(hidden_size=256, intermediate_size=256)
    x = torch.randn(16, 256, generator=torch.Generator().manual_seed(0))
    default, onednn = (Engine(model, EngineConfig(linear_kernel=k, num_blocks=4)).runner.decoder.head(x)
                       for k in ("torch", "onednn"))
    torch.testing.assert_close(onednn, default, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("threads", [1, pytest.param(2, marks=pytest.mark.slow)])  # slow: see test_engine.py
@pytest.mark.parametrize("dtype,kernel", [(torch.float32, "torch"), (torch.bfloat16, "torch"),
                                          pytest.param(torch.bfloat16, "onednn", marks=needs_onednn_bf16)])  # fp32 "onednn" = the default: test_engine
def test_bitwise_batch_invariance_holds_for_every_kernel_and_dtype(model, dtype, kernel, threads):
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        assert_batch_invariant(copy.deepcopy(model).to(dtype), linear_kernel=kernel)  # .to is in place
    finally:
        torch.set_num_threads(old)


def test_bf16_logprobs_are_computed_in_fp32_close_to_the_bf16_model():
    bf16 = small_model().to(torch.bfloat16)
    prompt = random_prompts([21], bf16.config.vocab_size, seed=2)[0]
    (r,) = Engine(bf16, BF16_KERNEL).generate([GenerationRequest(prompt, SamplingParams(0.7, max_new_tokens=16), seed=3)])
    logits = full_forward_logits(bf16, prompt, r.token_ids)  # bf16 forward, fp32 log-softmax
    tok = torch.tensor(r.token_ids)[:, None]
    # bf16 layers sum in another order than the model's forward: a few bf16 ulps of the logits (~2^-8 relative)
    torch.testing.assert_close(torch.tensor(r.model_logprobs), logits.log_softmax(-1).gather(1, tok).squeeze(1),
                               atol=0.05, rtol=0)
    assert all(isinstance(x, float) for x in r.logprobs) and max(r.logprobs) <= 0.0


def test_onednn_engine_follows_in_place_weight_updates():
    model = small_model(seed=0)
    prompt = random_prompts([16], model.config.vocab_size, seed=13)[0]
    engine = Engine(model, ONEDNN)
    greedy = SamplingParams(0.0, max_new_tokens=12)
    before = engine.generate([GenerationRequest(prompt, greedy)])[0].token_ids
    with torch.no_grad():  # a trainer's in-place step: the packed copies (head, o/down projections too) go stale
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    after = engine.generate([GenerationRequest(prompt, greedy)])[0].token_ids
    assert after == naive_greedy(model, prompt, 12) != before


def test_bad_kernel_settings_are_named(model):
    with pytest.raises(ValueError, match="linear_kernel must be"):
        EngineConfig(linear_kernel="mkl")
    with pytest.raises(ValueError, match="needs float32 or bfloat16 weights on a CPU"):
        Engine(small_model().to(torch.float16), ONEDNN)


def test_auto_picks_native_then_onednn_where_they_run_and_the_model_kernel_elsewhere():
    kernel = lambda m: Engine(m, EngineConfig(num_blocks=4)).linear_kernel  # noqa: E731
    assert kernel(small_model()) == ("native" if native_unsupported(torch.ones(1)) is None else "onednn")
    assert kernel(small_model().to(torch.bfloat16)) == ("onednn" if ONEDNN_BF16 else "torch")
    half = small_model().to(torch.float16)  # oneDNN packs no fp16 weights here: the model's own F.linear
    assert kernel(half) == "torch"
    prompt = random_prompts([7], half.config.vocab_size, seed=4)[0]
    (r,) = Engine(half, EngineConfig()).generate([GenerationRequest(prompt, SamplingParams(0.0, max_new_tokens=4))])
    assert len(r.token_ids) == 4
