"""A per-token objective through the LM head with its gradient formed during forward: three head GEMMs per step
instead of four, and nothing saved for backward but the two gradients.

When every token's loss depends on that token's own log-prob only, l_i = f_i(logp_i) (the token-level clipped
surrogate, the train/infer weight, k3: align.rl.grpo_loss with ratio_level "token"), d loss / d logp_i = f_i'(logp_i)
is known as soon as logp_i is, inside the chunk that computed it. So, per chunk of rows (the Liger approach, as
align.kernels.fused_ce does for plain CE):

    z = h W^T / T (fp32),  z' = z - max,  e = exp(z'),  s = sum e            one (c, V) GEMM, two (c, V) buffers
    logp_y = z'_y - log s,  H = log s - sum(e z') / s                       (align.rl.token_logprobs.tempered_chunk,
                                                                             shared with the unfused head)
    l_i, g_i = f_i(logp_i), f_i'(logp_i)                                     autograd on a (c,) vector: the loss
                                                                             formulas stay in grpo_loss, once
    dz = g (onehot(y) - e / s) / T   (in place in e)
    grad_h = dz W,  grad_W += dz^T h                                          two GEMMs
Backward only scales the stored gradients by the incoming scalar (the TrainModule's 1 / global units).
With the C rows (`native`: align.rl.token_logprobs.native_chunk, e = softmax - onehot(y) in place) the two
gradient GEMMs take only the rows whose g is not 0: GRPO's zero-advantage tokens without a KL term (the wrong
samples under `negative_scale = 0`, the zero-variance groups that fill a short rollout) are over a third of the
tiny recipe's trained samples. The sum is the same; the GEMMs' rounding is not (fewer rows in the grad-W reduction).

The GSPO sequence-level ratio couples every token of a sequence, so f_i is not per-token there: that variant uses
align.rl.token_logprobs (logits recomputed in backward) instead."""

from __future__ import annotations

from typing import Callable

import torch

from align.rl.token_logprobs import check_head_inputs, native_chunk, tempered_chunk

Objective = Callable[[torch.Tensor, slice], torch.Tensor]  # (logp (c,), rows) -> per-token loss (c,), differentiable


class _FusedObjective(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, inv_temp: float, chunk: int, objective: Objective, native: bool):
        # shape: hidden (N, D), weight (V, D), targets (N,) -> loss (), logp (N,), entropy (N,)
        n, acc = hidden.shape[0], torch.promote_types(hidden.dtype, torch.float32)
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.zeros_like(hidden) if want_h else None
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if want_w else None
        logp = torch.empty(n, dtype=acc, device=hidden.device)
        entropy = torch.empty(n, dtype=acc, device=hidden.device)
        total = torch.zeros((), dtype=acc, device=hidden.device)
        for lo in range(0, n, chunk):
            hi = min(lo + chunk, n)
            h, y = hidden[lo:hi], targets[lo:hi]
            want = grad_h is not None or grad_w is not None
            if native:  # e: softmax - onehot(y) in place of the logits (C rows), or the logits without a gradient
                e, lp, entropy[lo:hi], _ = native_chunk(h, weight, y, inv_temp, grad=want)
            else:
                e, s, lp, entropy[lo:hi], _ = tempered_chunk(h, weight, y, inv_temp)  # e: (c, V)
            logp[lo:hi] = lp
            with torch.enable_grad():
                x = lp.detach().requires_grad_(True)
                values = objective(x, slice(lo, hi))
                (g,) = torch.autograd.grad(values.sum(), x)
            total += values.detach().sum()
            if not want:
                continue
            # e becomes d loss / d z in place: g * (onehot(y) - softmax) / T
            g = g * inv_temp  # chain rule through z = h W^T / T, folded into the per-row factors
            rows = slice(lo, hi)
            if native:
                live = g.nonzero().squeeze(1)  # a token with g = 0 (advantage 0, no KL) adds nothing to either GEMM
                if live.numel() < hi - lo:
                    e, h, g, rows = e.index_select(0, live), h.index_select(0, live), g[live], live + lo
                e.mul_(-g[:, None])
            else:
                e.mul_((-g / s)[:, None])
                e[torch.arange(hi - lo, device=e.device), y] += g
            dz = e.to(hidden.dtype)  # low-precision operands for low-precision inputs (one cast, two GEMMs)
            if grad_h is not None:
                grad_h[rows] = dz @ weight  # (c, D); the rows left out keep their zeros
            if grad_w is not None:  # (V, D), summed across chunks in fp32
                grad_w.add_(dz.t() @ h) if h.dtype != acc else grad_w.addmm_(dz.t(), h)
        ctx.save_for_backward(grad_h, grad_w)
        ctx.weight_dtype = weight.dtype
        ctx.mark_non_differentiable(logp, entropy)
        return total, logp, entropy

    @staticmethod
    def backward(ctx, grad_total, _grad_logp, _grad_entropy):
        grad_h, grad_w = ctx.saved_tensors
        gh = grad_h * grad_total.to(grad_h.dtype) if grad_h is not None else None
        gw = (grad_w * grad_total).to(ctx.weight_dtype) if grad_w is not None else None
        return gh, gw, None, None, None, None, None


def fused_token_objective(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float,
                          objective: Objective, chunk_size: int = 1024, native: bool = False,
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sum_i objective_i(logp_i) differentiable in hidden and weight, logp (N,), entropy (N,)) where logp_i is
    log softmax(hidden W^T / temperature)[targets_i]; `objective(logp_chunk, rows)` returns that chunk's per-token
    losses and must depend on each token's own log-prob only. `native`: the row passes in C
    (align.rl.token_logprobs.native_chunk), as the unfused head does with the same flag."""
    check_head_inputs(weight, targets, temperature, chunk_size)
    return _FusedObjective.apply(hidden, weight, targets, 1.0 / float(temperature), int(chunk_size), objective,
                                 bool(native))
