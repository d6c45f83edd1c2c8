"""The engine runs an OLMoE policy (QK-norm and the sparse block in the decode step, paged KV as for dense):
greedy tokens equal the no-cache argmax loop of the model's own forward and their log-probs a full forward, for
each linear kernel and both expert backends; a weight update reaches the engine."""

from __future__ import annotations

import pytest
import torch

from align.inference import Engine, EngineConfig, GenerationRequest, SamplingParams
from align.model.olmoe import OlmoeConfig, OlmoeForCausalLM, set_expert_backend
from inference_helpers import assert_greedy_and_logprob_contracts, naive_greedy, random_prompts


def small_olmoe(seed: int = 0, experts: int = 8, top_k: int = 2) -> OlmoeForCausalLM:
    torch.manual_seed(seed)
    model = OlmoeForCausalLM(OlmoeConfig(vocab_size=384, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                         num_experts=experts, num_experts_per_tok=top_k, pad_token_id=0,
                                         eos_token_id=2)).eval()
    model.init_weights(std=0.1)  # spread logits: greedy choices not decided by float noise
    return model


@pytest.mark.parametrize("kernel", ["torch", "native"])
@pytest.mark.parametrize("backend", ["loop", "grouped"])
def test_greedy_and_logprobs_equal_the_model(kernel, backend):
    model = small_olmoe()
    set_expert_backend(model, backend)
    assert_greedy_and_logprob_contracts(model, EngineConfig(block_size=8, num_blocks=64, max_num_seqs=3,
                                                            max_num_batched_tokens=24, linear_kernel=kernel))


def test_top1_of_many_experts():
    model = small_olmoe(seed=1, experts=16, top_k=1)
    assert_greedy_and_logprob_contracts(model, EngineConfig(block_size=8, num_blocks=64, max_num_seqs=3,
                                                            max_num_batched_tokens=24))


def test_weight_update_reaches_the_experts():
    model = small_olmoe()
    engine = Engine(model, EngineConfig(block_size=8, num_blocks=32))
    prompt = random_prompts([7], 384, seed=3)[0]
    req = [GenerationRequest(prompt, SamplingParams(0.0, max_new_tokens=8))]
    before = engine.generate(req)[0].token_ids
    other = small_olmoe(seed=9)
    engine.load_weights(other.state_dict())
    after = engine.generate(req)[0].token_ids
    assert after == naive_greedy(other, prompt, 8) and after != before
