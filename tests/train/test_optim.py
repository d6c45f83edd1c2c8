"""align.train.optim and grad_norm: param groups, the factory and banner, global clipping."""

import math

import pytest
import torch

from align.exceptions import ConfigError
from align.train.grad_norm import clip_grads_, global_grad_norm
from align.train.optim import OptimizerConfig, make_optimizer, param_groups
from train_helpers import tiny_model


def _names(model, group):
    ids = {id(p) for p in group["params"]}
    return sorted(n for n, p in model.named_parameters() if id(p) in ids)


def test_no_decay_on_norms_biases_embeddings_by_default():
    model = tiny_model()
    decay, no_decay = param_groups(model, OptimizerConfig(weight_decay=0.1))
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    nd = _names(model, no_decay)
    assert "model.embed_tokens.weight" in nd and "model.norm.weight" in nd
    assert all(n.endswith("norm.weight") or "embed" in n for n in nd)
    assert "lm_head.weight" in _names(model, decay)
    assert "model.layers.0.self_attn.q_proj.weight" in _names(model, decay)


def test_tied_head_follows_the_embedding_and_appears_once():
    model = tiny_model(tie_word_embeddings=True)
    groups = param_groups(model, OptimizerConfig(weight_decay=0.1))
    all_ids = [id(p) for g in groups for p in g["params"]]
    assert len(all_ids) == len(set(all_ids)) == len(list(model.parameters()))
    assert id(model.lm_head.weight) in {id(p) for p in groups[1]["params"]}


def test_switches_put_everything_in_the_decay_group():
    cfg = OptimizerConfig(weight_decay=0.1, decay_norms=True, decay_embeddings=True, decay_biases=True)
    assert len(param_groups(tiny_model(), cfg)) == 1


def test_factory_builds_named_optimizer_with_banner():
    model = tiny_model()
    opt, banner = make_optimizer(model, OptimizerConfig(name="adamw8bit", lr=1e-3))
    assert type(opt).__name__ == "AdamW8bit" and "adamw8bit" in banner and "clip 1.0" in banner
    assert all(g["base_lr"] == 1e-3 for g in opt.param_groups)
    with pytest.raises(ConfigError, match="adamw8bit"):
        make_optimizer(model, OptimizerConfig(name="sgdx"))


def test_global_norm_and_clip_match_torch():
    model = tiny_model()
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    params = list(model.parameters())
    ours = global_grad_norm(params)
    ref = torch.nn.utils.get_total_norm([p.grad for p in params])
    assert math.isclose(ours, float(ref), rel_tol=1e-6)
    expected = [p.grad * (0.5 / (ours + 1e-6)) for p in params]
    coef = clip_grads_(params, ours, 0.5)
    assert coef < 1
    for p, e in zip(params, expected):
        torch.testing.assert_close(p.grad, e)
    assert math.isclose(global_grad_norm(params), 0.5, rel_tol=1e-5)


def test_clip_is_a_noop_below_the_limit_and_nonfinite_flag_gives_nan():
    model = tiny_model()
    for p in model.parameters():
        p.grad = torch.full_like(p, 1e-4)
    params = list(model.parameters())
    before = [p.grad.clone() for p in params]
    assert clip_grads_(params, global_grad_norm(params), 1.0) == 1.0
    assert all(torch.equal(a, p.grad) for a, p in zip(before, params))
    assert math.isnan(global_grad_norm(params, local_nonfinite=True))
