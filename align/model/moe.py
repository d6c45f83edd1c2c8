"""Sparse mixture-of-experts block: router, dropless dispatch, two expert backends, a fixed-order combine, and the
router statistics every auxiliary loss is computed from.

Data flow of one block on N tokens (d = hidden size, E experts, k experts per token, I = expert hidden size):

    route:          logits (N, E) -> fp32 softmax over all E -> top-k  -> Routing (probs, top-k ids and weights)
    sort_by_expert: the N*k flat assignments, stably argsorted by expert id -> Dispatch (order, counts)
    gather_rows:    x (N, d) -> x_sorted (N*k, d), rows grouped by expert, each group in token order (its backward
                    is a gather and the same fixed-order sum over k as combine's, not autograd's scatter-add)
    experts_*:      per expert SwiGLU on its rows (a Python loop, or one torch grouped GEMM)
    combine:        unsort back to (N, k, d), scale by the routing weights, sum over k in a fixed order

Dropless: every assignment is computed (no capacity factor, no token dropped). Deterministic: the argsort is
stable and the combine is a gather plus a left-to-right sum, so identical inputs give bitwise-identical outputs
on every run (a scatter/`index_add_` combine accumulates in whatever order the kernel picks; on GPU in bf16 that
gave different answers run to run). Numerics follow transformers' OLMoE: router logits in the activation dtype,
softmax and top-k in fp32, the top-k weights cast back to the activation dtype before they scale expert outputs.
`Router.router_dtype = "fp32"` (a training option, OLMo-core's) computes the router logits in fp32 instead.

The block adds no loss. It returns the router logits; `RouterStats` reduces them (with the top-k choice and a
token mask) to per-expert sums, which are additive over micro-batches and ranks (`totals` / `from_totals` pack
them for one all-reduce), and `load_balancing_loss` / `router_z_loss` / `expert_load_metrics` read only those.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from align.kernels import select, triton_moe

Backend = Literal["loop", "grouped"]
BACKENDS: tuple[str, ...] = ("loop", "grouped")
RouterDtype = Literal["activation", "fp32"]
ROUTER_DTYPES: tuple[str, ...] = ("activation", "fp32")


@dataclass(frozen=True)
class Routing:
    """The router's decision for N tokens."""

    logits: torch.Tensor  # (N, E) as the router's linear produced them (activation dtype, or fp32: router_dtype)
    probs: torch.Tensor  # (N, E) fp32 softmax over all experts
    topk_ids: torch.Tensor  # (N, k) int64 expert per slot, in descending probability
    topk_weights: torch.Tensor  # (N, k) activation dtype: the top-k probabilities (renormalised if asked)


def route(logits: torch.Tensor, top_k: int, norm_topk_prob: bool,
          weight_dtype: torch.dtype | None = None) -> Routing:
    """logits (N, E) -> Routing. Softmax over all experts in fp32 (fp64 for fp64 logits), then top-k;
    `norm_topk_prob` rescales the k chosen probabilities to sum to one (off for OLMoE-1B-7B). The top-k weights
    are cast to `weight_dtype` (the activations'; default: the logits')."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.promote_types(logits.dtype, torch.float32))  # fp64 stays
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return Routing(logits, probs, ids, weights.to(logits.dtype if weight_dtype is None else weight_dtype))


@dataclass(frozen=True)
class Dispatch:
    """Where each of the N*k flat assignments goes. Slot j of token t is flat row t*k + j."""

    order: torch.Tensor  # (N*k,) int64: flat rows sorted by expert id (stable: token order inside an expert)
    inverse: torch.Tensor  # (N*k,) int64: position of each flat row in `order`
    counts: torch.Tensor  # (E,) int64: rows per expert
    top_k: int


def sort_by_expert(topk_ids: torch.Tensor, num_experts: int) -> Dispatch:
    """topk_ids (N, k) -> Dispatch, by a stable argsort of the flat assignment."""
    flat = topk_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    counts = torch.bincount(flat, minlength=num_experts)
    return Dispatch(order, inverse, counts, topk_ids.shape[-1])


def fold_slots(y: torch.Tensor) -> torch.Tensor:
    """(N, k, d) -> (N, d): y[:, 0] + y[:, 1] + ..., added in this order (an explicit left fold, so the rounding
    never depends on a reduction kernel's choice). The one sum over a token's k slots, forward and backward."""
    out = y[:, 0]
    for j in range(1, y.shape[1]):
        out = out + y[:, j]
    return out


class _GatherRows(torch.autograd.Function):
    """x (N, d) -> x[order // k] (N*k, d), whose backward is a gather too. autograd's own index_select backward is
    an `index_add_` (a scatter-add; on CUDA its accumulation order is nondeterministic): here the gradient of
    token t is grad_sorted[inverse[t*k + j]] summed over j = 0, 1, ... by `fold_slots`, the combine's fixed order."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, order: torch.Tensor, inverse: torch.Tensor, top_k: int) -> torch.Tensor:
        ctx.save_for_backward(inverse)
        ctx.top_k = top_k
        return x.index_select(0, torch.div(order, top_k, rounding_mode="floor"))

    @staticmethod
    def backward(ctx, grad_sorted: torch.Tensor):
        (inverse,) = ctx.saved_tensors
        # made of differentiable ops, so double backward (create_graph=True) works too
        per_slot = grad_sorted.index_select(0, inverse).unflatten(0, (-1, ctx.top_k))
        return fold_slots(per_slot), None, None, None


def gather_rows(x: torch.Tensor, dispatch: Dispatch) -> torch.Tensor:
    """x (N, d) -> (N*k, d): each token's row once per chosen expert, grouped by expert (deterministic backward)."""
    return _GatherRows.apply(x, dispatch.order, dispatch.inverse, dispatch.top_k)


def unsort_rows(y_sorted: torch.Tensor, dispatch: Dispatch) -> torch.Tensor:
    """(N*k, d) in expert order -> (N, k, d) in token/slot order. A gather: no accumulation, no scatter."""
    return y_sorted.index_select(0, dispatch.inverse).unflatten(0, (-1, dispatch.top_k))


def combine(y: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """y (N, k, d) expert outputs, weights (N, k) -> (N, d): sum_j weights[:, j] * y[:, j], added j = 0, 1, ...
    in this order (`fold_slots`)."""
    return fold_slots(y * weights.unsqueeze(-1))


def _swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def experts_loop(x_sorted: torch.Tensor, counts: torch.Tensor, gate_up_proj: torch.Tensor,
                 down_proj: torch.Tensor) -> torch.Tensor:
    """Reference backend: one pair of matmuls per expert that received rows. (N*k, d) -> (N*k, d).

    NOTE: `counts.tolist()` is a host sync; the grouped backend avoids it."""
    outs = []
    for e, rows in enumerate(x_sorted.split(counts.tolist())):
        if rows.shape[0]:
            outs.append(F.linear(_swiglu(F.linear(rows, gate_up_proj[e])), down_proj[e]))
    return torch.cat(outs) if outs else x_sorted.new_zeros(x_sorted.shape)


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the incoming gradient contiguous. torch's CPU grouped_mm backward refuses
    a stride-0 gradient ("Invalid strides/sizes", e.g. the expanded ones of a `.sum()` loss)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous()


def _grouped(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """x (M, K), w (E, N, K) stored as nn.Linear weights -> (M, N), rows of group e multiplied by w[e]^T."""
    return _ContiguousGrad.apply(F.grouped_mm(x, w.transpose(-2, -1), offs=offs))


def grouped_supported(hidden_size: int, intermediate_size: int, dtype: torch.dtype) -> bool:
    """grouped_mm needs 16-byte aligned row strides of every operand."""
    size = torch.empty((), dtype=dtype).element_size()
    return all(n * size % 16 == 0 for n in (hidden_size, intermediate_size)) and hasattr(F, "grouped_mm")


def experts_grouped(x_sorted: torch.Tensor, counts: torch.Tensor, gate_up_proj: torch.Tensor,
                    down_proj: torch.Tensor) -> torch.Tensor:
    """Grouped-GEMM backend (torch's grouped_mm): two kernel calls for all experts, no host sync."""
    hidden, inter = down_proj.shape[1], down_proj.shape[2]
    if not grouped_supported(hidden, inter, x_sorted.dtype):
        raise ValueError(f"expert backend 'grouped' needs hidden_size ({hidden}) and intermediate_size ({inter}) "
                         f"whose rows are multiples of 16 bytes in {x_sorted.dtype}; use backend 'loop'")
    offs = torch.cumsum(counts, 0).to(torch.int32)
    return _grouped(_swiglu(_grouped(x_sorted, gate_up_proj, offs)), down_proj, offs)


EXPERT_BACKENDS = {"loop": experts_loop, "grouped": experts_grouped}


def router_compute_dtype(activation: torch.dtype, router_dtype: RouterDtype) -> torch.dtype:
    """The dtype the router's linear runs in: the activations' ("activation"), or at least fp32 ("fp32"; an fp64
    model stays fp64)."""
    if router_dtype == "activation":
        return activation
    if router_dtype == "fp32":
        return torch.promote_types(activation, torch.float32)
    raise ValueError(f"router_dtype must be one of {ROUTER_DTYPES}, got {router_dtype!r}")


class Router(nn.Module):
    """Linear scores over the experts: `weight` (E, d), the HF name `mlp.gate.weight`.

    `router_dtype` is align's training option, not part of the architecture (config.json never holds it):
    "activation" computes the logits in the activations' dtype as transformers does; "fp32" computes them from fp32
    copies of x and the weight (OLMo-core's bf16 training recipe: a bf16 router linear rounds near-tied logits
    together and flips top-k choices). Set from a stage's [model.moe] table or `set_router_dtype`."""

    def __init__(self, hidden_size: int, num_experts: int, router_dtype: RouterDtype = "activation"):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size))
        router_compute_dtype(torch.float32, router_dtype)  # validates
        self.router_dtype = router_dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = router_compute_dtype(x.dtype, self.router_dtype)
        return F.linear(x.to(dtype), self.weight.to(dtype))

    def init_parameters(self, std: float) -> None:
        nn.init.trunc_normal_(self.weight, std=std, a=-3 * std, b=3 * std)


class Experts(nn.Module):
    """E SwiGLU experts as two stacked 3-D parameters in transformers' fused layout:
    `gate_up_proj` (E, 2I, d) (gate rows first, then up) and `down_proj` (E, d, I), each slice an nn.Linear weight."""

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, backend: Backend = "loop"):
        super().__init__()
        if backend not in EXPERT_BACKENDS:
            raise ValueError(f"expert backend must be one of {BACKENDS}, got {backend!r}")
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))
        self.backend = backend

    def forward(self, x_sorted: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        return EXPERT_BACKENDS[self.backend](x_sorted, counts, self.gate_up_proj, self.down_proj)

    def init_parameters(self, std: float) -> None:
        for w in (self.gate_up_proj, self.down_proj):
            nn.init.trunc_normal_(w, std=std, a=-3 * std, b=3 * std)


class SparseMoeBlock(nn.Module):
    """Router + experts in place of a dense MLP. forward: x (..., d) -> (out (..., d), router logits (N, E)).

    `ep` is the expert-parallel hook: None runs every expert locally; align.model.moe_ep.apply_expert_parallel sets
    it (the process groups) and puts an `ExpertShard` in `experts`, which moves the sorted rows to the ranks that
    hold their experts and back, so this forward is the same code with and without EP."""

    kernel_name = "moe_permute"  # tokens to experts and back: torch gathers or align/kernels/triton_moe.py

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int,
                 norm_topk_prob: bool, backend: Backend = "loop", router_dtype: RouterDtype = "activation"):
        super().__init__()
        self.kernel = "auto"
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k must be in [1, num_experts={num_experts}], got {top_k}")
        self.gate = Router(hidden_size, num_experts, router_dtype)
        self.experts = Experts(hidden_size, intermediate_size, num_experts, backend)
        self.num_experts, self.top_k, self.norm_topk_prob = num_experts, top_k, norm_topk_prob
        self.ep = None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        flat = x.reshape(-1, x.shape[-1])
        routing = route(self.gate(flat), self.top_k, self.norm_topk_prob, weight_dtype=x.dtype)
        dispatch = sort_by_expert(routing.topk_ids, self.num_experts)
        if select.resolve(self.kernel_name, self.kernel, x.device) == "triton":
            order, inverse, k = dispatch.order, dispatch.inverse, dispatch.top_k
            y = self.experts(triton_moe.permute(flat, order, inverse, k), dispatch.counts)
            out = combine(triton_moe.unpermute(y, order, inverse, k), routing.topk_weights)
            return out.view_as(x), routing.logits
        y = self.experts(gather_rows(flat, dispatch), dispatch.counts)
        return combine(unsort_rows(y, dispatch), routing.topk_weights).view_as(x), routing.logits


@dataclass(frozen=True)
class RouterStats:
    """Sufficient statistics of the aux losses over some tokens, per layer. Additive: the stats of a union of
    token sets are the sums (micro-batches of a window, ranks of a global batch).

    counts and tokens are plain numbers (no gradient); prob_sums and z_sums carry the router's gradient."""

    counts: torch.Tensor  # (L, E) router dtype (fp32; fp64 for an fp64 model): top-k assignments per expert
    prob_sums: torch.Tensor  # (L, E): router probabilities summed over tokens
    z_sums: torch.Tensor  # (L,): sum over tokens of logsumexp(logits)^2
    tokens: torch.Tensor  # (): tokens counted (the same in every layer)
    top_k: int
    entropy_sums: torch.Tensor | None = None  # (L,): sum over tokens of the router distribution's entropy (nats)

    @property
    def num_layers(self) -> int:
        return self.counts.shape[0]

    @property
    def num_experts(self) -> int:
        return self.counts.shape[1]

    @staticmethod
    def from_logits(layer_logits: list[torch.Tensor], top_k: int,
                    mask: torch.Tensor | None = None) -> "RouterStats":
        """layer_logits: per layer (N, E) router logits; mask (N,) bool/0-1, True = count this token."""
        counts, probs, zs, ents = [], [], [], []
        weight = None if mask is None else mask.reshape(-1, 1).float()
        for logits in layer_logits:
            routing = route(logits, top_k, norm_topk_prob=False)
            p = routing.probs
            hits = torch.zeros_like(p).scatter_(1, routing.topk_ids, 1.0).detach()
            z = torch.logsumexp(logits.to(p.dtype), dim=-1, keepdim=True).square()
            ent = -(p * torch.log_softmax(logits.to(p.dtype), dim=-1)).sum(-1, keepdim=True).detach()
            if weight is not None:
                hits, p, z, ent = hits * weight, p * weight, z * weight, ent * weight
            counts.append(hits.sum(0))
            probs.append(p.sum(0))
            zs.append(z.sum())
            ents.append(ent.sum())
        n = probs[0].new_tensor(layer_logits[0].shape[0] if mask is None else float(weight.sum()))
        return RouterStats(torch.stack(counts), torch.stack(probs), torch.stack(zs), n, top_k, torch.stack(ents))

    def __add__(self, other: "RouterStats") -> "RouterStats":
        return RouterStats(self.counts + other.counts, self.prob_sums + other.prob_sums,
                           self.z_sums + other.z_sums, self.tokens + other.tokens, self.top_k,
                           self.entropy() + other.entropy())

    def entropy(self) -> torch.Tensor:
        """(L,) entropy sums (zeros for stats built without them)."""
        return self.entropy_sums if self.entropy_sums is not None else torch.zeros_like(self.z_sums.detach())

    def detach(self) -> "RouterStats":
        return RouterStats(self.counts, self.prob_sums.detach(), self.z_sums.detach(), self.tokens, self.top_k,
                           self.entropy_sums)

    def totals(self) -> torch.Tensor:
        """Everything packed in one flat tensor (detached), for a single all-reduce."""
        return torch.cat([self.counts.flatten(), self.prob_sums.detach().flatten(), self.z_sums.detach(),
                          self.tokens.reshape(1), self.entropy()])

    @staticmethod
    def from_totals(flat: torch.Tensor, num_layers: int, num_experts: int, top_k: int) -> "RouterStats":
        le = num_layers * num_experts
        if flat.numel() != 2 * le + 2 * num_layers + 1:
            raise ValueError(f"RouterStats.from_totals: {flat.numel()} values for L={num_layers} E={num_experts}")
        z_end = 2 * le + num_layers
        return RouterStats(flat[:le].view(num_layers, num_experts), flat[le:2 * le].view(num_layers, num_experts),
                           flat[2 * le:z_end], flat[z_end], top_k, flat[z_end + 1:])


LossConvention = Literal["switch", "hf"]


def load_balancing_loss(stats: RouterStats, convention: LossConvention = "switch",
                        dispatch_from: RouterStats | None = None) -> torch.Tensor:
    """Auxiliary load-balancing loss E * sum_e f_e * P_e (Switch Transformer, eq. 4).

    "switch" (OLMoE's training code): per layer, f_e = share of the layer's N*k assignments that went to e and
    P_e = mean router probability of e; averaged over layers. "hf" (transformers' `load_balancing_loss_func`):
    counts and probabilities pooled over all layers first, f_e = assignments / (N*L) (so it is k times larger
    for one layer). `dispatch_from`: take f from these stats (e.g. the global batch) and P from `stats`;
    the gradient flows through P only, as in both references (f comes from a top-k and has none)."""
    f_stats = stats if dispatch_from is None else dispatch_from
    e = stats.num_experts
    if convention == "switch":
        f = f_stats.counts / (f_stats.tokens * stats.top_k)  # (L, E)
        p = stats.prob_sums / stats.tokens
        return e * (f * p).sum(-1).mean()
    if convention == "hf":
        rows = f_stats.tokens * f_stats.num_layers
        f = f_stats.counts.sum(0) / rows
        p = stats.prob_sums.sum(0) / (stats.tokens * stats.num_layers)
        return e * (f * p).sum()
    raise ValueError(f"load-balancing convention must be 'switch' or 'hf', got {convention!r}")


def router_z_loss(stats: RouterStats) -> torch.Tensor:
    """ST-MoE router z-loss: mean over tokens of logsumexp(logits)^2, averaged over layers."""
    return (stats.z_sums / stats.tokens).mean()


def expert_load_metrics(stats: RouterStats) -> dict[str, float]:
    """Telemetry of the expert load (no gradient), from the assignment counts:

    max_vio: max over layers of (max_e load - mean load) / mean load (0 = perfect balance); max_vio_layer: the
    layer it is reached in (the first, on a tie); utilization: share of (layer, expert) pairs that received at
    least one token; dead_experts: how many did not; dead_experts_max: the most dead experts of any one layer,
    dead_experts_max_layer: that layer (the first, on a tie; -1 when no expert of any layer is dead);
    load_entropy: mean over layers of the load distribution's entropy / log E (1 = uniform)."""
    counts = stats.counts.detach().double()
    mean = counts.mean(-1)
    vio = (counts.max(-1).values - mean) / mean.clamp_min(1e-12)
    share = counts / counts.sum(-1, keepdim=True).clamp_min(1e-12)
    entropy = -(share * share.clamp_min(1e-300).log()).sum(-1)
    norm = torch.log(torch.tensor(float(stats.num_experts), dtype=torch.float64)).clamp_min(1e-12)
    dead = (counts == 0).sum(-1)  # (L,)
    worst_dead = int(dead.max())
    return {"max_vio": float(vio.max()), "max_vio_layer": _first_argmax(vio),
            "utilization": float((counts > 0).double().mean()), "dead_experts": int(dead.sum()),
            "dead_experts_max": worst_dead, "dead_experts_max_layer": _first_argmax(dead) if worst_dead else -1,
            "load_entropy": float((entropy / norm).mean())}


def _first_argmax(values: torch.Tensor) -> int:
    """Index of the first maximum (torch.argmax does not promise which of tied maxima it returns)."""
    return int((values == values.max()).nonzero()[0, 0])
