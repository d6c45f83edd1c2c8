"""align.train.moe_module: global-scope aux gradient equals one loss over the whole batch (fp64), stage defaults,
the proxy counts only grad-enabled forwards, moe/* history columns, CE as the reported loss, the aux term's
effect on training, a non-finite aux term making the loss non-finite, and the router-collapse tripwire."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from align.exceptions import HaltError
from align.model.moe import RouterStats, load_balancing_loss, router_z_loss
from align.train.moe_module import (METRIC_KEYS, MoeAuxConfig, RouterCollapseTripwire, _StatsProxy, moe_module,
                                    window_metrics)
from align.train.optim import OptimizerConfig
from align.train.sft_loss import SftLossConfig
from align.train.sft_module import SftTrainModule
from align.train.train_module import AccumInfo, TrainModuleConfig
from align.utils.tracking import read_history
from moe_train_helpers import tiny_moe
from train_helpers import assert_bitwise_equal, build_sft, sft_batch, weights

MoESft = moe_module(SftTrainModule)


def test_stage_defaults_and_overrides():
    assert MoeAuxConfig().coefficients("pretrain") == (0.01, 0.001)
    for stage in ("sft", "dpo", "grpo"):
        assert MoeAuxConfig().coefficients(stage) == (0.0, 0.0)
    assert MoeAuxConfig(load_balance=0.5, z_loss=0.0).coefficients("pretrain") == (0.5, 0.0)


def _module_grads(model, batch, aux: MoeAuxConfig, units: float) -> dict:
    model.zero_grad()
    module = MoESft(model, TrainModuleConfig(), SftLossConfig(fused=False), total_steps=1, moe_aux=aux)
    module.train_batch(batch, AccumInfo(0, 1, units, 1))
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("convention", ["switch", "hf"])
def test_window_gradient_is_one_global_loss_fp64(convention):
    """One micro-batch per window: the module's aux gradient (its gradient with the aux terms minus without, the
    CE path being the same) equals d/dθ [lb * LB + z * Z] of the batch computed directly, through the Trainer's
    world/units scale. NOTE: atol 1e-7: align's reference CE rounds through fp32, and its gradient shares the
    backward with the aux terms; a scale error would be of the aux gradient's own size (checked > 1e-3)."""
    model = tiny_moe(dtype=torch.float64)
    batch = sft_batch(4, 12)
    units = float((batch["labels"][:, 1:] != -100).sum())
    on = _module_grads(model, batch, MoeAuxConfig(load_balance=0.3, z_loss=0.05, convention=convention), units)
    off = _module_grads(model, batch, MoeAuxConfig(load_balance=0.0, z_loss=0.0), units)
    model.zero_grad()
    _, stats = model(batch["input_ids"], batch["attention_mask"], return_router_stats=True)
    (0.3 * load_balancing_loss(stats, convention) + 0.05 * router_z_loss(stats)).backward()
    for n, p in model.named_parameters():
        want = p.grad if p.grad is not None else torch.zeros_like(p)
        torch.testing.assert_close(on[n] - off[n], want, rtol=1e-5, atol=1e-7, msg=n)
    assert model.model.layers[0].mlp.gate.weight.grad.abs().max() > 1e-3


def test_global_scope_last_micro_batch_is_exact_fp64():
    """Two micro-batches: the sum of their aux gradients equals the global loss's gradient exactly when both
    micro-batches route identically (then f of the first already is the window's f)."""
    model = tiny_moe(dtype=torch.float64)
    aux = MoeAuxConfig(load_balance=1.0, z_loss=0.0)
    module = MoESft(model, TrainModuleConfig(), SftLossConfig(fused=False), total_steps=1, moe_aux=aux)
    half = sft_batch(2, 10, seed=3)
    for p in model.parameters():
        p.requires_grad_(p is model.model.layers[0].mlp.gate.weight or p is model.model.layers[1].mlp.gate.weight)
    nolabel = dict(half, labels=torch.full_like(half["labels"], -100))  # aux only
    for i in range(2):
        module.train_batch(nolabel, AccumInfo(i, 2, 1.0, 1))
    got = [model.model.layers[i].mlp.gate.weight.grad.clone() for i in range(2)]
    model.zero_grad()
    both = {k: torch.cat([v, v]) for k, v in nolabel.items()}
    _, stats = model(both["input_ids"], both["attention_mask"], return_router_stats=True)
    load_balancing_loss(stats).backward()
    for i in range(2):
        torch.testing.assert_close(got[i], model.model.layers[i].mlp.gate.weight.grad, rtol=1e-10, atol=1e-12)


def test_proxy_counts_only_grad_forwards():
    sink = []
    proxy = _StatsProxy(tiny_moe(), sink)
    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        proxy.forward_hidden(ids)
    assert sink == []
    hidden = proxy.forward_hidden(ids)
    assert hidden.shape == (1, 4, 32) and len(sink) == 1 and sink[0].tokens.item() == 4
    assert proxy.lm_head is proxy.inner.lm_head


def test_sft_history_columns_ce_loss_and_aux_effect(tmp_path):
    plain = build_sft(tmp_path / "a", max_steps=3, checkpoint_every=0, model=tiny_moe(), base=MoESft,
                      module_kwargs={"stage": "sft"})
    assert plain.fit() == 0
    aux = build_sft(tmp_path / "b", max_steps=3, checkpoint_every=0, model=tiny_moe(), base=MoESft,
                    module_kwargs={"moe_aux": MoeAuxConfig(load_balance=1.0, z_loss=0.1)})
    assert aux.fit() == 0
    rows_a, rows_b = read_history(tmp_path / "a" / "history.jsonl"), read_history(tmp_path / "b" / "history.jsonl")
    for row in rows_a + rows_b:
        assert all(k in row and math.isfinite(row[k]) for k in METRIC_KEYS), row
    # the reported loss is the CE alone: equal at step 1 (same weights), although the optimised loss differs
    assert rows_a[0]["loss"] == rows_b[0]["loss"]
    assert rows_a[0]["moe/lb_loss"] == rows_b[0]["moe/lb_loss"] >= 1.0 - 1e-6
    wa, wb = weights(plain.module), weights(aux.module)
    assert not torch.equal(wa["model.layers.0.mlp.gate.weight"], wb["model.layers.0.mlp.gate.weight"])


def test_window_metrics_name_the_worst_layers():
    """moe/max_vio_layer and moe/dead_experts_max(_layer) from the window's per-layer counts; NaN before a window."""
    counts = torch.tensor([[4.0, 4.0, 0.0, 0.0], [3.0, 3.0, 1.0, 1.0], [8.0, 0.0, 0.0, 0.0]])
    stats = RouterStats(counts, torch.full((3, 4), 1.0), torch.zeros(3), torch.tensor(4.0), 2, torch.zeros(3))
    m = window_metrics(stats, "switch")
    assert set(m) == set(METRIC_KEYS)
    assert (m["moe/max_vio"], m["moe/max_vio_layer"]) == (3.0, 2.0)  # layer 2: (8 - 2) / 2
    assert (m["moe/dead_experts_max"], m["moe/dead_experts_max_layer"]) == (3.0, 2.0)
    assert m["moe/frac_dead"] == 5 / 12
    module = MoESft(tiny_moe(), TrainModuleConfig(), SftLossConfig(fused=False), total_steps=1)
    assert all(math.isnan(v) for v in module._moe_last.values()) and set(module._moe_last) == set(METRIC_KEYS)


def test_nonfinite_aux_makes_the_loss_nonfinite():
    model = tiny_moe()
    module = MoESft(model, TrainModuleConfig(optimizer=OptimizerConfig(lr=1e-3)), SftLossConfig(fused=False),
                    total_steps=1, moe_aux=MoeAuxConfig(load_balance=float("inf")))
    batch = sft_batch(2, 8)
    out = module.train_batch(batch, AccumInfo(0, 1, 10.0, 1))
    assert bool(out.nonfinite) and math.isfinite(float(out.sums["ce_sum"]))


def test_collapse_tripwire_halts(tmp_path):
    t = build_sft(tmp_path, max_steps=3, checkpoint_every=0, model=tiny_moe(), base=MoESft,
                  callbacks=[RouterCollapseTripwire(max_vio=0.0)])
    with pytest.raises(HaltError, match="router collapse: MaxVio"):
        t.fit()
    assert RouterCollapseTripwire().observe(None, {"moe/frac_dead": 1.0, "moe/max_vio": 99.0}) is None


def test_sigterm_then_resume_moe_sft_is_bitwise_equal(tmp_path):
    """MoE SFT with the aux terms on, stopped by SIGTERM mid-window (step 3's second micro-batch): the coordinated
    stop checkpoints step 3, and the resumed run ends bitwise equal to an uninterrupted one, history included."""
    import os
    import signal

    kw = dict(max_steps=5, checkpoint_every=4, base=MoESft,
              module_kwargs={"moe_aux": MoeAuxConfig(load_balance=0.1, z_loss=0.01)})
    full = build_sft(tmp_path / "full", model=tiny_moe(), **kw)
    assert full.fit() == 0

    def sigterm(module, batch, info, count=[0]):
        count[0] += 1
        if count[0] == 6:
            os.kill(os.getpid(), signal.SIGTERM)

    cut = build_sft(tmp_path / "cut", model=tiny_moe(), fault=sigterm, **kw)
    assert cut.fit() == 128 + signal.SIGTERM and cut.step == 3
    resumed = build_sft(tmp_path / "cut", model=tiny_moe(seed=5), **kw)
    assert resumed.fit() == 0 and resumed.resumed_from.name == "step_3"
    assert_bitwise_equal(weights(full.module), weights(resumed.module))
    rows_full = read_history(tmp_path / "full" / "history.jsonl")
    rows_cut = read_history(tmp_path / "cut" / "history.jsonl")
    assert [r["loss"] for r in rows_cut] == [r["loss"] for r in rows_full]
    assert [r["moe/max_vio"] for r in rows_cut] == [r["moe/max_vio"] for r in rows_full]


def test_moe_callbacks_are_armed_only_by_a_threshold():
    from align.train.moe_module import moe_callbacks

    assert moe_callbacks(MoeAuxConfig()) == []
    (trip,) = moe_callbacks(MoeAuxConfig(collapse_max_dead_fraction=0.25))
    assert trip.observe(None, {"moe/frac_dead": 0.5, "moe/max_vio": 0.0}).startswith("router collapse: 0.500")
    assert trip.observe(None, {"moe/frac_dead": 0.25, "moe/max_vio": 9.0}) is None


def test_micro_scope_is_the_mean_of_per_micro_batch_losses_fp64():
    """scope "micro" (the ablation): the window's aux gradient is that of the mean over micro-batches of each
    micro-batch's own load-balance loss (its own f, P and token count)."""
    from moe_train_helpers import aux_only_batch

    model = tiny_moe(dtype=torch.float64)
    module = MoESft(model, TrainModuleConfig(), SftLossConfig(fused=False), total_steps=1,
                    moe_aux=MoeAuxConfig(load_balance=1.0, z_loss=0.5, scope="micro"))
    batches = [aux_only_batch(0), aux_only_batch(1)]
    for i, b in enumerate(batches):
        module.train_batch(b, AccumInfo(i, 2, 1.0, 1))
    gate = model.model.layers[0].mlp.gate.weight
    got = gate.grad.clone()
    model.zero_grad()
    total = 0.0
    for b in batches:
        _, stats = model(b["input_ids"], b["attention_mask"], return_router_stats=True)
        total = total + 0.5 * (load_balancing_loss(stats) + 0.5 * router_z_loss(stats))
    total.backward()
    torch.testing.assert_close(got, gate.grad, rtol=1e-10, atol=1e-14)
