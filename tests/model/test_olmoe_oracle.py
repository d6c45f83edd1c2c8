"""Oracle: align's OlmoeForCausalLM equals transformers' on tiny configs (top-1/2/8, 4-64 experts, norm_topk_prob
on and off): fp32 logits and gradients, router logits/probabilities, the top-k expert sets, and the aux loss of
transformers' `load_balancing_loss_func` (the "hf" convention), padded batches included."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from align.model.layers import rope_inv_freq
from align.model.moe import load_balancing_loss, route
from align.model.olmoe import OlmoeForCausalLM, set_expert_backend
from moe_helpers import hf_olmoe_twin, random_ids, tiny_olmoe

pytestmark = pytest.mark.oracle
transformers = pytest.importorskip("transformers")
from transformers.models.olmoe.modeling_olmoe import load_balancing_loss_func  # noqa: E402

CASES = [  # (num_experts, top_k, norm_topk_prob)
    (4, 1, False), (4, 2, True), (8, 2, False), (16, 8, True), (64, 8, False), (64, 1, True),
]
GRAD_PARAMS = ("model.embed_tokens.weight", "model.layers.0.self_attn.q_norm.weight",
               "model.layers.0.self_attn.k_norm.weight", "model.layers.0.mlp.gate.weight",
               "model.layers.1.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.down_proj", "lm_head.weight")


def _close(a: torch.Tensor, b: torch.Tensor, tol: float) -> bool:
    return (a - b).abs().max().item() <= tol * max(1.0, b.abs().max().item())


@pytest.mark.parametrize("experts,top_k,norm", CASES)
@pytest.mark.parametrize("backend", ["loop", "grouped"])
def test_logits_router_aux_and_grads(experts, top_k, norm, backend):
    torch.manual_seed(experts * 10 + top_k)
    cfg = tiny_olmoe(num_experts=experts, num_experts_per_tok=top_k, norm_topk_prob=norm)
    ours = OlmoeForCausalLM(cfg)
    set_expert_backend(ours, backend)
    twin = hf_olmoe_twin(ours)
    ids = random_ids(cfg, 3, 11, seed=experts)
    logits, stats = ours(ids, return_router_stats=True)
    ref = twin(ids, output_router_logits=True)
    assert _close(logits, ref.logits, 1e-5)
    _, our_router = ours.model(ids)
    for mine, theirs in zip(our_router, ref.router_logits):
        assert _close(mine, theirs, 1e-5)
        r, hp = route(mine, top_k, norm), torch.softmax(theirs, dim=-1, dtype=torch.float32)
        assert _close(r.probs, hp, 1e-6)
        hf_ids = torch.topk(hp, top_k, dim=-1).indices
        assert torch.equal(r.topk_ids.sort(-1).values, hf_ids.sort(-1).values)
    aux = load_balancing_loss(stats, "hf")
    assert abs(aux.item() - ref.aux_loss.item()) <= 1e-6 * max(1.0, ref.aux_loss.item())
    loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten()) + 0.01 * aux
    ref_loss = F.cross_entropy(ref.logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten()) + 0.01 * ref.aux_loss
    loss.backward()
    ref_loss.backward()
    mine_p, ref_p = dict(ours.named_parameters()), dict(twin.named_parameters())
    for name in GRAD_PARAMS:
        g, rg = mine_p[name].grad, ref_p[name].grad
        assert _close(g, rg, 1e-4), name


def test_padded_batch_logits_and_masked_aux():
    torch.manual_seed(3)
    cfg = tiny_olmoe(num_experts=8, num_experts_per_tok=2)
    ours = OlmoeForCausalLM(cfg)
    twin = hf_olmoe_twin(ours)
    ids = random_ids(cfg, 3, 9, seed=5)
    mask = torch.ones(3, 9, dtype=torch.bool)
    mask[0, 6:], mask[2, 3:] = False, False  # right padding
    logits, stats = ours(ids, mask, return_router_stats=True)
    ref = twin(ids, attention_mask=mask.long(), output_router_logits=True)
    assert _close(logits[mask], ref.logits[mask], 1e-5)
    assert stats.tokens.item() == mask.sum().item()
    hf_aux = load_balancing_loss_func(ref.router_logits, cfg.num_experts, cfg.num_experts_per_tok, mask.long())
    assert abs(load_balancing_loss(stats, "hf").item() - hf_aux.item()) <= 1e-6 * max(1.0, hf_aux.item())


def test_bf16_logits_close():
    torch.manual_seed(4)
    cfg = tiny_olmoe(num_experts=8, num_experts_per_tok=2)
    ours = OlmoeForCausalLM(cfg).to(torch.bfloat16)
    twin = hf_olmoe_twin(ours).to(torch.bfloat16)
    # transformers' .to(bf16) also rounds its RoPE inv_freq buffer; compare the models, not that cast
    twin.model.rotary_emb.inv_freq = rope_inv_freq(cfg.head_dim, cfg.rope_theta)
    ids = random_ids(cfg, 2, 10, seed=1)
    logits, ref = ours(ids), twin(ids).logits
    assert _close(logits.float(), ref.float(), 2e-2)
