"""align.model.moe on its own: dispatch, both expert backends against a dense brute-force reference, bitwise
determinism over five runs, the CPU grouped-GEMM stride-0 gradient, RouterStats additivity and packing, the aux
losses' conventions, load metrics on hand-made counts, and that init reaches every OLMoE parameter."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from align.model.moe import (RouterStats, SparseMoeBlock, expert_load_metrics, fold_slots, gather_rows,
                             load_balancing_loss, route, router_z_loss, sort_by_expert)
from align.model.olmoe import OlmoeConfig, OlmoeForCausalLM
from moe_helpers import tiny_olmoe


def block(experts=8, top_k=2, norm=False, backend="loop", seed=0, d=32, inter=16) -> SparseMoeBlock:
    torch.manual_seed(seed)
    b = SparseMoeBlock(d, inter, experts, top_k, norm, backend)
    for m in (b.gate, b.experts):
        m.init_parameters(0.2)
    return b


def brute_force(b: SparseMoeBlock, x: torch.Tensor) -> torch.Tensor:
    """Every token through every chosen expert one at a time: sum_j w_j * down_e(silu(gate_e x) * up_e x)."""
    r = route(b.gate(x), b.top_k, b.norm_topk_prob)
    inter = b.experts.down_proj.shape[2]
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(b.top_k):
            e = int(r.topk_ids[t, j])
            gu = b.experts.gate_up_proj[e] @ x[t]
            h = F.silu(gu[:inter]) * gu[inter:]
            out[t] += r.topk_weights[t, j] * (b.experts.down_proj[e] @ h)
    return out


def test_dispatch_is_stable_and_counts():
    ids = torch.tensor([[2, 0], [0, 1], [2, 1], [0, 2]])
    d = sort_by_expert(ids, 4)
    assert d.order.tolist() == [1, 2, 6, 3, 5, 0, 4, 7]  # expert 0 rows in token order, then 1, then 2
    assert d.counts.tolist() == [3, 2, 3, 0]
    assert torch.equal(d.order[d.inverse], torch.arange(8))


def _random_dispatch(n: int, experts: int, top_k: int, seed: int, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(n)]).to(device)
    return sort_by_expert(ids, experts)


def test_gather_rows_gradcheck_fp64():
    """gather_rows' own backward (a gather + the slot fold) is the derivative of the forward, first and second order."""
    d = _random_dispatch(6, 5, 3, seed=10)
    x = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: gather_rows(t, d), (x,))
    assert torch.autograd.gradgradcheck(lambda t: gather_rows(t, d), (x,))


@pytest.mark.parametrize("top_k", [1, 2, 4, 8])
def test_gather_rows_grad_equals_index_select_grad(top_k):
    """The same gradient as autograd's index_select (scatter-add) in fp64: bitwise for k <= 2 (one addition,
    commutative), to rounding for more slots (the two add in different orders)."""
    d = _random_dispatch(11, 8, top_k, seed=11)
    x = torch.randn(11, 16, dtype=torch.float64, requires_grad=True)
    grad_out = torch.randn(11 * top_k, 16, dtype=torch.float64)
    (ours,) = torch.autograd.grad(gather_rows(x, d), x, grad_out)
    (ref,) = torch.autograd.grad(x.index_select(0, d.order // top_k), x, grad_out)
    if top_k <= 2:
        assert torch.equal(ours, ref)
    else:
        torch.testing.assert_close(ours, ref, rtol=1e-14, atol=1e-14)


def test_gather_rows_grad_is_the_slot_order_fold():
    """Token t's gradient is bitwise grad[slot 0] + grad[slot 1] + ... in slot order (the combine's order), not in
    the expert-sorted order a scatter-add visits the rows in (fp32, k = 8: the orders round differently)."""
    d = _random_dispatch(64, 16, 8, seed=12)
    x = torch.randn(64, 32, requires_grad=True)
    grad_out = torch.randn(64 * 8, 32, generator=torch.Generator().manual_seed(13)) * 1e3
    (ours,) = torch.autograd.grad(gather_rows(x, d), x, grad_out)
    per_slot = grad_out[d.inverse].view(64, 8, 32)
    assert torch.equal(ours, fold_slots(per_slot))
    assert not torch.equal(ours, torch.zeros_like(x).index_add_(0, d.order // 8, grad_out))


DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA")])]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gather_rows_backward_bitwise_over_five_passes(device, dtype):
    """Five backward passes of one graph give bitwise-equal input gradients (CUDA's index_add_ would not promise it)."""
    d = _random_dispatch(257, 16, 4, seed=14, device=device)
    x = torch.randn(257, 64, device=device, dtype=dtype, requires_grad=True)
    out = gather_rows(x, d)
    grad_out = torch.randn(out.shape, device=device, dtype=dtype)
    grads = [torch.autograd.grad(out, x, grad_out, retain_graph=True)[0] for _ in range(5)]
    assert all(torch.equal(g, grads[0]) for g in grads[1:])


@pytest.mark.parametrize("backend", ["loop", "grouped"])
@pytest.mark.parametrize("experts,top_k,norm", [(4, 1, False), (8, 2, True), (16, 8, False)])
def test_block_matches_brute_force(backend, experts, top_k, norm):
    b = block(experts, top_k, norm, backend)
    x = torch.randn(13, 32, generator=torch.Generator().manual_seed(1))
    out, logits = b(x)
    assert logits.shape == (13, experts)
    torch.testing.assert_close(out, brute_force(b, x), rtol=1e-5, atol=1e-5)


def test_loop_and_grouped_agree_forward_and_backward():
    """Including a `.sum()` loss, whose stride-0 gradient torch's CPU grouped_mm backward refuses unaided."""
    x = torch.randn(2, 9, 32, generator=torch.Generator().manual_seed(2))
    results = []
    for backend in ("loop", "grouped"):
        b = block(8, 2, False, backend, seed=3)
        xi = x.clone().requires_grad_(True)
        out, _ = b(xi)
        out.sum().backward()
        results.append((out.detach(), xi.grad, b.experts.gate_up_proj.grad, b.experts.down_proj.grad,
                        b.gate.weight.grad))
    for a, g in zip(*results):
        torch.testing.assert_close(a, g, rtol=1e-5, atol=1e-6)


def test_grouped_refuses_unaligned_shapes():
    b = block(4, 2, False, "grouped", d=30, inter=14)
    with pytest.raises(ValueError, match="multiples of 16 bytes"):
        b(torch.randn(5, 30))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # the seed's index_add_ combine failed in bf16
@pytest.mark.parametrize("backend", ["loop", "grouped"])
def test_five_runs_bitwise_identical(backend, dtype):
    """Outputs, expert sets and gradients are bitwise equal over five runs of identical inputs (ties included:
    the input repeats rows, so several tokens route identically and land in the same expert groups)."""
    x = torch.randn(7, 32, generator=torch.Generator().manual_seed(4)).repeat(3, 1).to(dtype)
    runs = []
    for _ in range(5):
        b = block(16, 4, True, backend, seed=5).to(dtype)
        out, logits = b(x)
        (out.square().sum()).backward()
        ids = route(logits, 4, True).topk_ids
        runs.append([out.detach(), ids, b.experts.gate_up_proj.grad, b.gate.weight.grad])
    for run in runs[1:]:
        for a, ref in zip(run, runs[0]):
            assert torch.equal(a, ref)


def test_router_stats_additive_and_packed():
    g = torch.Generator().manual_seed(6)
    logits = [torch.randn(10, 6, generator=g) for _ in range(3)]
    whole = RouterStats.from_logits(logits, 2)
    parts = RouterStats.from_logits([x[:4] for x in logits], 2) + RouterStats.from_logits([x[4:] for x in logits], 2)
    for a, b in zip(whole.totals(), parts.totals()):
        assert math.isclose(a.item(), b.item(), rel_tol=1e-6, abs_tol=1e-6)
    back = RouterStats.from_totals(whole.totals(), 3, 6, 2)
    assert torch.equal(back.totals(), whole.totals())
    assert whole.counts.sum().item() == 3 * 10 * 2 and whole.tokens.item() == 10
    masked = RouterStats.from_logits(logits, 2, mask=torch.arange(10) < 4)
    torch.testing.assert_close(masked.totals(), RouterStats.from_logits([x[:4] for x in logits], 2).totals())


def test_aux_loss_conventions():
    g = torch.Generator().manual_seed(7)
    one_layer = RouterStats.from_logits([torch.randn(20, 8, generator=g)], 4)
    # one layer: transformers' f is assignments per token, Switch's per assignment, a factor top_k apart
    assert math.isclose(load_balancing_loss(one_layer, "hf").item(), 4 * load_balancing_loss(one_layer).item(),
                        rel_tol=1e-6)
    # perfectly balanced: each of E experts gets 1/E of the assignments and mean probability 1/E -> loss 1
    uniform = RouterStats(torch.full((2, 4), 5.0), torch.full((2, 4), 2.5), torch.zeros(2), torch.tensor(10.0), 2)
    assert math.isclose(load_balancing_loss(uniform).item(), 1.0, rel_tol=1e-6)
    with pytest.raises(ValueError, match="convention"):
        load_balancing_loss(uniform, "gshard")


def test_router_entropy_sums():
    uniform = RouterStats.from_logits([torch.zeros(6, 4)], 2)
    assert uniform.entropy().item() == pytest.approx(6 * math.log(4))
    peaked = RouterStats.from_logits([torch.tensor([[50.0, 0.0, 0.0, 0.0]])], 1)
    assert peaked.entropy().item() == pytest.approx(0.0, abs=1e-12)


def test_z_loss_is_mean_squared_logsumexp():
    logits = torch.tensor([[0.0, 0.0], [1.0, 3.0]])
    stats = RouterStats.from_logits([logits], 1)
    expected = (math.log(2) ** 2 + (3 + math.log(1 + math.exp(-2))) ** 2) / 2
    assert math.isclose(router_z_loss(stats).item(), expected, rel_tol=1e-6)


def test_expert_load_metrics_on_known_counts():
    counts = torch.tensor([[4.0, 0.0, 2.0, 2.0], [2.0, 2.0, 2.0, 2.0]])
    stats = RouterStats(counts, torch.zeros(2, 4), torch.zeros(2), torch.tensor(4.0), 2)
    m = expert_load_metrics(stats)
    assert m["max_vio"] == pytest.approx(1.0)  # layer 0: (4 - 2) / 2
    assert m["utilization"] == pytest.approx(7 / 8) and m["dead_experts"] == 1
    h0 = -(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25)) / math.log(4)
    assert m["load_entropy"] == pytest.approx((h0 + 1.0) / 2)


def test_expert_load_metrics_per_layer():
    """The worst MaxVio's layer and the layer with the most dead experts (first on ties, -1 when none is dead)."""
    counts = torch.tensor([[2.0, 2.0, 2.0, 2.0], [5.0, 1.0, 1.0, 1.0], [6.0, 2.0, 0.0, 0.0], [5.0, 3.0, 0.0, 0.0]])
    m = expert_load_metrics(RouterStats(counts, torch.zeros(4, 4), torch.zeros(4), torch.tensor(4.0), 2))
    assert m["max_vio"] == pytest.approx(2.0) and m["max_vio_layer"] == 2  # (6 - 2) / 2; layer 1: 1.5
    assert m["dead_experts"] == 4 and m["dead_experts_max"] == 2 and m["dead_experts_max_layer"] == 2
    balanced = RouterStats(torch.full((3, 4), 2.0), torch.zeros(3, 4), torch.zeros(3), torch.tensor(4.0), 2)
    m = expert_load_metrics(balanced)
    assert m["max_vio_layer"] == 0 and m["dead_experts_max"] == 0 and m["dead_experts_max_layer"] == -1


def test_init_reaches_every_parameter():
    model = OlmoeForCausalLM(tiny_olmoe(num_experts=4), init=False)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))
    model.init_weights()
    for name, p in model.named_parameters():
        assert torch.isfinite(p).all(), name
        assert p.std() > 0 or name.endswith("norm.weight"), name


def test_meta_build_then_init():
    with torch.device("meta"):
        model = OlmoeForCausalLM(tiny_olmoe(), init=False)
    model.to_empty(device="cpu")
    model.init_weights()
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert torch.isfinite(model(torch.tensor([[3, 4, 5]]))).all()


def test_config_refuses_what_olmoe_is_not():
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        tiny_olmoe(num_experts=4, num_experts_per_tok=5)
    with pytest.raises(ValueError, match="sliding_window"):
        tiny_olmoe(sliding_window=16)
    with pytest.raises(ValueError, match="head_dim"):
        tiny_olmoe(head_dim=8)
    with pytest.raises(TypeError, match="OlmoeConfig"):
        from align.model import MistralConfig
        OlmoeForCausalLM(MistralConfig())
    assert isinstance(tiny_olmoe(), OlmoeConfig)
