"""The engine samples from base + LoRA adapter without merging (align.lora.decode, Engine.load_adapters,
align.lora.stage.AdapterWeightsClient): the same tokens and fp32-close log-probs as an engine on the merged
model, a sync that moves only adapter bytes and never repacks the base, zero adapters bitwise the plain engine,
batch invariance kept."""

from __future__ import annotations

import pytest
import torch

from align.inference import Engine, EngineConfig, GenerationRequest, SamplingParams
from align.lora.adapters import ADAPTER_KEYS, LoraConfig, apply_lora, lora_layers, merge_state_dict
from align.lora.stage import AdapterWeightsClient, lora_client
from align.rollout.native import NativeRolloutClient
from inference_helpers import assert_batch_invariant, random_prompts, small_model

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
KERNELS = ("native", "torch")


def _policy(targets=TARGETS, seed: int = 3, b_std: float = 0.05):
    """A LoRA policy over small_model()'s weights with random nonzero B (as after training)."""
    policy = small_model()
    cfg = LoraConfig(rank=4, alpha=8.0, target_modules=targets)
    apply_lora(policy, cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in lora_layers(policy).values():
            layer.lora_B.weight.copy_(torch.randn(layer.lora_B.weight.shape, generator=g) * b_std)
    return policy.eval(), cfg


def _requests(vocab: int):
    prompts = random_prompts([5, 19, 33, 8, 27, 12], vocab, seed=4)
    greedy = SamplingParams(0.0, max_new_tokens=16)
    sampled = SamplingParams(1.0, top_k=50, top_p=0.95, max_new_tokens=16)
    return [GenerationRequest(p, greedy if i % 2 else sampled, seed=i) for i, p in enumerate(prompts)]


def _adapter_engine(policy, cfg, kernel: str) -> AdapterWeightsClient:
    client = AdapterWeightsClient(NativeRolloutClient(small_model().eval().requires_grad_(False),
                                                      EngineConfig(linear_kernel=kernel)), cfg)
    client.update_weights({k: p.detach() for k, p in policy.named_parameters()}, version=1)
    return client


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("targets", [TARGETS, ("q_proj", "v_proj", "down_proj")])
def test_base_plus_adapter_samples_as_the_merged_model(kernel, targets):
    policy, cfg = _policy(targets)
    merged = small_model().eval()
    merged.load_state_dict(merge_state_dict(policy.state_dict(), cfg.scaling))
    reqs = _requests(merged.config.vocab_size)
    want = Engine(merged, EngineConfig(linear_kernel=kernel)).generate(reqs)
    client = _adapter_engine(policy, cfg, kernel)
    got = client.engine.generate(reqs)
    for w, g in zip(want, got):
        assert g.token_ids == w.token_ids and len(w.token_ids) == 16  # exactly the same tokens
        torch.testing.assert_close(torch.tensor(g.model_logprobs), torch.tensor(w.model_logprobs), atol=2e-5, rtol=0)
        torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(w.logprobs), atol=2e-5, rtol=0)
    # and not trivially: the adapters change what the base alone would sample
    base = Engine(small_model().eval(), EngineConfig(linear_kernel=kernel)).generate(reqs)
    assert any(b.token_ids != w.token_ids for b, w in zip(base, want))


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_sync_moves_only_adapter_bytes_and_never_repacks_the_base(kernel, monkeypatch):
    policy, cfg = _policy()
    client = _adapter_engine(policy, cfg, kernel)
    engine = client.engine
    dec = engine.runner.decoder
    engine.generate(_requests(policy.config.vocab_size)[:2])
    base_copies = [(f.wqkv, f.wo, f.wgu, f.wdown) for f in dec.fused] + [dec.whead]
    base_versions = {k: p._version for k, p in engine.model.named_parameters() if not k.endswith(ADAPTER_KEYS)}
    adapter_copies = [dict(a) for a in dec.adapters]
    loaded = []
    real = Engine.load_adapters
    monkeypatch.setattr(Engine, "load_adapters", lambda self, sd, version=None: loaded.append(sd) or
                        real(self, sd, version))
    with torch.no_grad():  # an optimizer step on the adapters
        for layer in lora_layers(policy).values():
            layer.lora_B.weight.mul_(1.5)
            layer.lora_A.weight.add_(0.01)
    weights = {k: p.detach() for k, p in policy.named_parameters()}  # what GrpoTrainModule.push_weights sends
    assert client.update_weights(weights, version=2) == 2
    (sent,) = loaded
    assert set(sent) == {k for k in weights if k.endswith(ADAPTER_KEYS)}
    adapter_bytes = sum(t.numel() * t.element_size() for t in sent.values())
    assert adapter_bytes == sum(4 * cfg.rank * (m.in_features + m.out_features) for m in lora_layers(policy).values())
    assert [(f.wqkv, f.wo, f.wgu, f.wdown) for f in dec.fused] + [dec.whead] == base_copies  # same objects
    assert {k: p._version for k, p in engine.model.named_parameters()
            if not k.endswith(ADAPTER_KEYS)} == base_versions  # the base was never written
    assert all(a[n] is not b[n] for a, b in zip(dec.adapters, adapter_copies) for n in a)  # adapters rebuilt
    # and the engine now samples the updated policy: its model's forward is the LoRA model's
    for k, p in engine.model.named_parameters():
        assert torch.equal(p, weights[k])


@pytest.mark.parametrize("kernel", KERNELS)
def test_zero_adapters_sample_bitwise_as_the_plain_engine(kernel):
    policy, cfg = _policy(b_std=0.0)  # B = 0: a fresh LoRA policy
    reqs = _requests(policy.config.vocab_size)
    want = Engine(small_model().eval(), EngineConfig(linear_kernel=kernel)).generate(reqs)
    got = _adapter_engine(policy, cfg, kernel).engine.generate(reqs)
    for w, g in zip(want, got):
        assert (g.token_ids, g.logprobs, g.model_logprobs) == (w.token_ids, w.logprobs, w.model_logprobs)


@pytest.mark.parametrize("kernel", KERNELS)
def test_base_plus_adapter_is_batch_invariant(kernel):
    policy, _ = _policy()
    assert_batch_invariant(policy, linear_kernel=kernel)


def test_the_first_push_refuses_a_policy_on_another_base():
    policy, cfg = _policy()
    client = AdapterWeightsClient(NativeRolloutClient(small_model(seed=1).eval().requires_grad_(False)), cfg)
    with pytest.raises(ValueError, match="differs from the sampler's base"):
        client.update_weights({k: p.detach() for k, p in policy.named_parameters()})


def test_load_adapters_wants_exactly_the_adapter_tensors():
    policy, cfg = _policy()
    client = _adapter_engine(policy, cfg, "torch")
    adapters = {k: p.detach() for k, p in policy.named_parameters() if k.endswith(ADAPTER_KEYS)}
    with pytest.raises(KeyError, match="missing keys"):
        client.engine.load_adapters(dict(list(adapters.items())[1:]))
    with pytest.raises(KeyError, match="unknown keys"):
        client.engine.load_adapters({**adapters, "lm_head.weight": policy.lm_head.weight.detach()})
    with pytest.raises(ValueError, match="no LoRA adapters"):
        Engine(small_model()).load_adapters(adapters)


def test_engine_sync_merged_keeps_the_plain_sampler():
    policy, cfg = _policy()
    merged_cfg = LoraConfig(rank=4, alpha=8.0, target_modules=TARGETS, engine_sync="merged")
    client = lora_client(NativeRolloutClient(small_model().eval().requires_grad_(False)), merged_cfg)
    client.update_weights({k: p.detach() for k, p in policy.named_parameters()})
    assert not lora_layers(client.engine.model)
    with pytest.raises(ValueError, match="engine_sync"):
        LoraConfig(engine_sync="fused")


@pytest.mark.parametrize("kernel", KERNELS)
def test_olmoe_attention_adapters_sample_as_the_merged_model(kernel):
    """OLMoE: adapters on the attention projections (what apply_lora supports there) run before the QK-norm."""
    from test_engine_olmoe import small_olmoe

    policy = small_olmoe()
    cfg = LoraConfig(rank=4, alpha=8.0, target_modules=("q_proj", "k_proj", "v_proj", "o_proj"))
    apply_lora(policy, cfg)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for layer in lora_layers(policy).values():
            layer.lora_B.weight.copy_(torch.randn(layer.lora_B.weight.shape, generator=g) * 0.05)
    merged = small_olmoe()
    merged.load_state_dict(merge_state_dict(policy.state_dict(), cfg.scaling))
    reqs = _requests(merged.config.vocab_size)
    want = Engine(merged, EngineConfig(linear_kernel=kernel)).generate(reqs)
    client = AdapterWeightsClient(NativeRolloutClient(small_olmoe().requires_grad_(False),
                                                      EngineConfig(linear_kernel=kernel)), cfg)
    client.update_weights({k: p.detach() for k, p in policy.named_parameters()})
    got = client.engine.generate(reqs)
    for w, g_ in zip(want, got):
        assert g_.token_ids == w.token_ids
        torch.testing.assert_close(torch.tensor(g_.model_logprobs), torch.tensor(w.model_logprobs), atol=2e-5, rtol=0)


def test_wrapping_the_sampler_leaves_the_global_rng_alone():
    """The stage wraps the sampler before the policy (open_rl_stage, then maybe_lora): the policy's adapter init
    must not depend on it."""
    _, cfg = _policy()
    sampler = NativeRolloutClient(small_model().eval().requires_grad_(False))
    torch.manual_seed(11)
    want = torch.rand(4)
    torch.manual_seed(11)
    AdapterWeightsClient(sampler, cfg)
    assert torch.equal(torch.rand(4), want)
