"""Unit tests of align.model.mistral / attention / layers: init, tying, attention paths, KV cache, the engine's
qkv seam, determinism and activation checkpointing. No oracle libraries needed."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from align.model import AttentionConfig, MistralForCausalLM, MistralForProcessReward, MistralForValueHead
from align.model.attention import attention
from model_helpers import random_ids, tiny_config


@pytest.mark.parametrize("cls", [MistralForCausalLM, MistralForValueHead, MistralForProcessReward])
def test_init_writes_every_parameter(cls):
    cfg = tiny_config(initializer_range=0.05, pad_token_id=3)
    with torch.device("meta"):
        model = cls(cfg)
    model = model.to_empty(device="cpu")
    for p in model.parameters():
        p.data.fill_(float("nan"))
    model.init_weights()
    for name, p in model.named_parameters():
        assert torch.isfinite(p).all(), f"{name} left uninitialised"
    w = model.model.layers[0].mlp.gate_proj.weight
    assert 0.8 * 0.05 < w.std().item() < 1.05 * 0.05 and w.abs().max().item() <= 3 * 0.05
    assert (model.model.layers[1].post_attention_layernorm.weight == 1).all()
    assert (model.model.embed_tokens.weight[3] == 0).all()


def test_init_refuses_unknown_parameterised_module():
    model = MistralForCausalLM(tiny_config())
    model.extra = nn.LayerNorm(4)
    with pytest.raises(TypeError, match="extra"):
        model.init_weights()


def test_tied_and_untied_heads():
    tied = MistralForCausalLM(tiny_config(tie_word_embeddings=True))
    assert tied.lm_head.weight is tied.model.embed_tokens.weight
    assert len(list(tied.parameters())) == len(list(MistralForCausalLM(tiny_config()).parameters())) - 1
    untied = MistralForCausalLM(tiny_config())
    assert untied.lm_head.weight.data_ptr() != untied.model.embed_tokens.weight.data_ptr()


def test_forward_hidden_times_head_is_forward():
    model = MistralForCausalLM(tiny_config())
    ids = random_ids(model.config, 2, 9)
    torch.testing.assert_close(model.forward_hidden(ids) @ model.lm_head.weight.T, model(ids), rtol=0, atol=1e-6)


def padded_batch(cfg, lengths, t):
    ids = random_ids(cfg, len(lengths), t, seed=7)
    mask = torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]
    return ids, mask


@pytest.mark.parametrize("window", [None, 5])
def test_eager_equals_sdpa(window):
    cfg = tiny_config(sliding_window=window, num_key_value_heads=1)
    sdpa = MistralForCausalLM(cfg)
    eager = MistralForCausalLM(cfg, AttentionConfig(impl="eager"))
    eager.load_state_dict(sdpa.state_dict())
    ids, mask = padded_batch(cfg, [12, 7, 12], 12)
    for m in (None, mask):
        a, b = sdpa(ids, m), eager(ids, m)
        keep = mask if m is not None else torch.ones_like(mask)
        torch.testing.assert_close(a[keep], b[keep], rtol=0, atol=2e-6)


def test_left_padding_with_positions_equals_unpadded():
    cfg = tiny_config()
    model = MistralForCausalLM(cfg)
    ids = random_ids(cfg, 1, 6)
    padded = torch.cat([torch.zeros(1, 4, dtype=torch.long), ids], dim=1)
    mask = torch.cat([torch.zeros(1, 4, dtype=torch.bool), torch.ones(1, 6, dtype=torch.bool)], dim=1)
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    out = model(padded, mask, positions)
    assert torch.isfinite(out).all()  # fully masked rows give zeros, not NaN
    torch.testing.assert_close(out[:, 4:], model(ids), rtol=0, atol=2e-6)


@pytest.mark.parametrize("window", [None, 4])
def test_kv_cache_decode_equals_full_forward(window):
    cfg = tiny_config(sliding_window=window)
    model = MistralForCausalLM(cfg).eval()
    full = random_ids(cfg, 3, 14)
    prompt_lens = [5, 9, 2]
    total = 14
    expected = model(full)  # (B, T, V)
    cache = model.new_kv_cache(batch_size=3, max_len=total)
    prompt, pmask = full[:, :9], torch.arange(9)[None, :] < torch.tensor(prompt_lens)[:, None]
    out = model(prompt, pmask, kv_cache=cache)
    for b, n in enumerate(prompt_lens):
        torch.testing.assert_close(out[b, :n], expected[b, :n], rtol=0, atol=2e-5)
    assert cache.lengths.tolist() == prompt_lens
    for step in range(total - max(prompt_lens)):  # one token per sequence per step, each at its own position
        nxt = torch.stack([full[b, n + step] for b, n in enumerate(prompt_lens)])[:, None]
        out = model(nxt, kv_cache=cache)
        for b, n in enumerate(prompt_lens):
            torch.testing.assert_close(out[b, 0], expected[b, n + step], rtol=0, atol=2e-5)


def test_kv_cache_refuses_overflow_and_left_padding():
    model = MistralForCausalLM(tiny_config())
    cache = model.new_kv_cache(batch_size=1, max_len=4)
    with pytest.raises(ValueError, match="max_len"):
        model(random_ids(model.config, 1, 5), kv_cache=cache)
    with pytest.raises(ValueError, match="right-padded"):
        model(random_ids(model.config, 1, 3), torch.tensor([[False, True, True]]), kv_cache=cache)


def test_qkv_seam_reproduces_the_layer():
    """The engine's path: qkv on a flat token list + its own attention + o_proj = the layer's attention."""
    cfg = tiny_config(num_key_value_heads=1)
    model = MistralForCausalLM(cfg)
    attn = model.model.layers[0].self_attn
    hidden = torch.randn(2, 7, cfg.hidden_size)
    pos = torch.arange(7)[None].expand(2, 7)
    q, k, v = attn.qkv(hidden, pos)
    assert q.shape == (2, 7, 4, 16) and k.shape == v.shape == (2, 7, 1, 16)
    fq, fk, fv = attn.qkv(hidden.flatten(0, 1), pos.flatten())  # (N, D) tokens, (N,) positions
    for a, b in ((q, fq), (k, fk), (v, fv)):
        torch.testing.assert_close(a.flatten(0, 1), b, rtol=0, atol=1e-6)
    out = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None)  # (B, H, T, Dh)
    rebuilt = attn.o_proj(out.transpose(1, 2).flatten(2))
    torch.testing.assert_close(rebuilt, attn(hidden, attn.rope(pos, hidden.dtype)), rtol=0, atol=1e-6)


def grads(model, ids):
    model.zero_grad(set_to_none=True)
    model(ids).logsumexp(-1).sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_deterministic_mode_is_bitwise_repeatable():
    model = MistralForCausalLM(tiny_config(), AttentionConfig(deterministic=True))
    ids = random_ids(model.config, 2, 16)
    g1, g2 = grads(model, ids), grads(model, ids)
    assert all(torch.equal(g1[n], g2[n]) for n in g1)


def test_activation_checkpointed_block_gives_same_grads_and_keeps_hf_names():
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing

    from align.model import MistralDecoderLayer

    model = MistralForCausalLM(tiny_config())
    ids = random_ids(model.config, 2, 10)
    ref, keys = grads(model, ids), list(model.state_dict())
    apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, MistralDecoderLayer))
    assert type(model.model.layers[0]).__name__ == "CheckpointWrapper"
    assert list(model.state_dict()) == keys  # checkpoints still save/load with transformers' key names
    got = {k.replace("._checkpoint_wrapped_module", ""): v for k, v in grads(model, ids).items()}
    for n in ref:
        torch.testing.assert_close(got[n], ref[n], rtol=0, atol=1e-7)


def test_bf16_parameters_run_in_bf16():
    model = MistralForCausalLM(tiny_config()).to(torch.bfloat16)
    out = model(random_ids(model.config, 2, 8))
    assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()
