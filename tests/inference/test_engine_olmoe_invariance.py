"""Batch invariance of the OLMoE decode step: a request decoded alone and inside batches of others (reversed,
small token budgets, few running sequences, preemption, a shared prefix) gives bitwise-identical tokens and
log-probs, for every linear kernel and dtype the dense path guarantees it for. The expert products are the
engine's own (SparseMlp): row-invariant on the native kernel, padded to measured row counts on the others."""

from __future__ import annotations

import copy

import pytest
import torch

from align.inference import EngineConfig
from align.inference.product_kernels import onednn_can_run
from align.model.olmoe import set_router_dtype
from inference_helpers import assert_batch_invariant, assert_greedy_and_logprob_contracts
from test_engine_olmoe import small_olmoe


BF16_ONEDNN = pytest.mark.skipif(not onednn_can_run(torch.empty(1, dtype=torch.bfloat16)),
                                 reason="oneDNN's bf16 path needs AVX-512 (BW/VL/DQ) or AVX-NE-CONVERT")


@pytest.mark.parametrize("dtype,kernel", [(torch.float32, "native"), (torch.float32, "torch"),
                                          (torch.bfloat16, "torch"),
                                          pytest.param(torch.bfloat16, "onednn", marks=BF16_ONEDNN)])
def test_olmoe_tokens_and_logprobs_are_bitwise_identical_alone_or_in_any_batch(dtype, kernel):
    assert_batch_invariant(small_olmoe().to(dtype), linear_kernel=kernel)


@pytest.mark.parametrize("kernel", ["torch", pytest.param("onednn", marks=BF16_ONEDNN)])
def test_top1_of_many_experts_and_the_fp32_router_in_bf16(kernel):
    """The fp32 router of a bf16 model runs on the native kernel's fp32 panels (row-invariant)."""
    model = small_olmoe(seed=1, experts=16, top_k=1).to(torch.bfloat16)
    set_router_dtype(model, "fp32")
    assert_batch_invariant(model, linear_kernel=kernel)


def test_two_threads_native():
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert_batch_invariant(copy.deepcopy(small_olmoe(seed=2)))
    finally:
        torch.set_num_threads(old)


@pytest.mark.parametrize("cpu_kernels", ["native", "torch"])
def test_the_native_attention_path_applies_qk_norm(cpu_kernels):
    """Block size 16 (the default) takes the runner's native path, where RoPE and the KV write run in C on
    `qkv_proj`'s output: greedy tokens must still be the model's and log-probs a full forward's (the QK-norm was
    once applied only on the torch path, so the default engine decoded another model)."""
    model = small_olmoe(seed=3)
    with torch.no_grad():  # norms that differ from ones, so a skipped norm cannot pass for an applied one
        for layer in model.model.layers:
            layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)
            layer.self_attn.k_norm.weight.uniform_(0.5, 1.5)
    assert_greedy_and_logprob_contracts(model, EngineConfig(num_blocks=64, max_num_seqs=3,
                                                            max_num_batched_tokens=24, cpu_kernels=cpu_kernels))
