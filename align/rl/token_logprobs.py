"""Per-token log-probs (and entropies) of sampled completions at the sampling temperature, from the hidden states and
the LM head in chunks: the `[tokens, vocab]` logits never exist at once.

GRPO needs one differentiable number per completion token, log softmax(h W^T / T)[y], and its gradient coefficient
is only known after the loss has seen every token (ratio, clip, advantage), so the head's gradient cannot be formed
during forward (align.kernels.fused_ce does that for plain CE). As align.kernels.fused_dpo does for DPO, the logits
are recomputed chunk by chunk in backward (four head GEMMs per step instead of three), and peak extra memory stays
one (chunk, V) fp32 buffer. Unlike fused_dpo this returns per-token values, applies the temperature, and also gives
the entropy of the tempered distribution per token (the tripwire's input) from the same forward chunk, for free:

    z = h W^T / T,  lse = logsumexp(z),  logp_y = z_y - lse,  H = lse - sum_v softmax(z)_v z_v
    backward: d logp_y / d z = onehot(y) - softmax(z);  d z / d h = W / T,  d z / d W = h^T / T

The batch layout (align.rl.assembly): `input_ids (B, T)` right-padded prompt + completion, `completion_start (B,)`
the prompt lengths, `completion_ids (B, C)` and `completion_mask (B, C)`; token j of row b is predicted by the
hidden state at position completion_start[b] - 1 + j."""

from __future__ import annotations

import torch

from align.kernels import ce_rows


def _acc(t: torch.Tensor) -> torch.dtype:
    return torch.promote_types(t.dtype, torch.float32)


def tempered_logits(h: torch.Tensor, weight: torch.Tensor, inv_temp: float) -> torch.Tensor:
    """z = h W^T / T of one chunk, (c, V) fp32; from bf16 operands the GEMM's output is bf16-rounded (CPU)."""
    z = (h @ weight.t()).to(_acc(h))
    if inv_temp != 1.0:
        z.mul_(inv_temp)
    return z


def tempered_chunk(h: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, inv_temp: float):
    """One chunk's head in torch ops: (e = exp(z - max) (c, V), s = sum e, logp_y, entropy, lse) with z = h W^T / T
    in fp32. Shared by both GRPO heads so that they give the same bits for the same rows (pi_old scored by one, the
    training forward by the other, must agree exactly when the weights are the same); `native_chunk` is the same
    head with its row passes in C."""
    z = tempered_logits(h, weight, inv_temp)  # (c, V)
    peak = z.amax(dim=-1, keepdim=True)
    z.sub_(peak)
    e = z.exp()  # (c, V), the second buffer
    s = e.sum(dim=-1)
    log_s = s.log()
    logp = z.gather(1, y[:, None]).squeeze(1) - log_s
    entropy = log_s - torch.linalg.vecdot(e, z) / s
    return e, s, logp, entropy, log_s + peak.squeeze(1)


def native_chunk(h: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, inv_temp: float, grad: bool):
    """One chunk's head with the row passes in C (align.kernels.ce_rows: per row, in L2, the max, the exp sums and,
    with `grad`, the softmax written over the logits; torch's exp_ and vecdot over the (c, V) block are bound by
    the exp on a CPU): (buffer (c, V), logp_y, entropy, lse). With `grad` the buffer holds d(-logp_y)/dz =
    softmax(z) - onehot(y), else the logits z. The same bits for the same rows whichever of the two GRPO heads
    calls it (the kernel's statistics do not depend on `grad`)."""
    z = tempered_logits(h, weight, inv_temp)
    lse, ce, entropy = ce_rows.ce_rows_(z, y, 0.0, grad)
    return z, ce.neg_(), entropy, lse


def chunk_logprobs(h: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, inv_temp: float, native: bool):
    """(logp_y, entropy, lse) of one chunk through the torch or the C row passes (no gradient buffer)."""
    if native:
        return native_chunk(h, weight, y, inv_temp, grad=False)[1:]
    return tempered_chunk(h, weight, y, inv_temp)[2:]


class _TemperedTokenLogprob(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, inv_temp: float, chunk: int, native: bool):
        # shape: hidden (N, D) completion rows only, weight (V, D), targets (N,) -> logp (N,), entropy (N,)
        n, acc = hidden.shape[0], _acc(hidden)
        logp = torch.empty(n, dtype=acc, device=hidden.device)
        lse = torch.empty(n, dtype=acc, device=hidden.device)
        entropy = torch.empty(n, dtype=acc, device=hidden.device)
        for lo in range(0, n, chunk):
            hi = min(lo + chunk, n)
            logp[lo:hi], entropy[lo:hi], lse[lo:hi] = chunk_logprobs(hidden[lo:hi], weight, targets[lo:hi],
                                                                     inv_temp, native)
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.inv_temp, ctx.chunk, ctx.native = inv_temp, chunk, native
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, _grad_entropy):
        hidden, weight, targets, lse = ctx.saved_tensors
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        acc, s = lse.dtype, ctx.inv_temp
        grad_h = torch.empty_like(hidden) if want_h else None
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if want_w else None
        g_all = grad_logp.to(acc)
        for lo in range(0, hidden.shape[0], ctx.chunk):
            hi = min(lo + ctx.chunk, hidden.shape[0])
            h, g = hidden[lo:hi], g_all[lo:hi]
            # d loss / d z = g * (onehot(y) - softmax(z)), built in place in the recomputed logits buffer
            if ctx.native:  # the C rows give softmax - onehot; the scale folds in the chain rule through 1 / T
                dz = native_chunk(h, weight, targets[lo:hi], s, grad=True)[0].mul_((-g * s)[:, None])
            else:
                dz = (h @ weight.t()).to(acc).mul_(s).sub_(lse[lo:hi, None]).exp_().mul_(-g[:, None])
                dz[torch.arange(hi - lo, device=dz.device), targets[lo:hi]] += g
                dz.mul_(s)  # chain rule through z = (h W^T) * inv_temp
            if grad_h is not None:
                torch.matmul(dz.to(hidden.dtype), weight, out=grad_h[lo:hi])  # (c, D)
            if grad_w is not None:  # a low-precision GEMM for low-precision inputs, fp32 sum across chunks
                grad_w.add_(dz.to(h.dtype).t() @ h if h.dtype != acc else dz.t().mm(h))
        if grad_w is not None:
            grad_w = grad_w.to(weight.dtype)
        return grad_h, grad_w, None, None, None, None


def check_head_inputs(weight: torch.Tensor, targets: torch.Tensor, temperature: float, chunk_size: int) -> None:
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 for log-probs of sampled tokens, got {temperature}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= weight.shape[0]):
        raise ValueError(f"targets must lie in [0, {weight.shape[0]})")


def tempered_token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float,
                            chunk_size: int = 1024, native: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp, entropy) of `targets` under softmax(hidden W^T / temperature); hidden (N, D), targets (N,).
    logp is differentiable in hidden and weight; entropy is detached. `native`: the row passes in C
    (`native_chunk`; align.kernels.fused_ce.use_native decides it from a `[loss] kernel`)."""
    check_head_inputs(weight, targets, temperature, chunk_size)
    return _TemperedTokenLogprob.apply(hidden, weight, targets, 1.0 / float(temperature), int(chunk_size),
                                       bool(native))


def completion_positions(batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat indices into the (B*T) hidden rows that predict each real completion token, in (B, C) mask order, and
    that mask as bool. A completion token j of row b is predicted at position completion_start[b] - 1 + j."""
    ids, start, mask = batch["input_ids"], batch["completion_start"], batch["completion_mask"].bool()
    b, t = ids.shape
    c = mask.shape[1]
    pos = start[:, None] - 1 + torch.arange(c, device=ids.device)[None, :]  # (B, C)
    flat = torch.arange(b, device=ids.device)[:, None] * t + pos.clamp(0, t - 1)
    return flat[mask], mask


def completion_rows(model, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(hidden rows (N, D) that predict the real completion tokens, those tokens (N,), the (B, C) bool mask)."""
    hidden = model.forward_hidden(batch["input_ids"])  # (B, T, D); right padding: causal attention is exact
    rows, mask = completion_positions(batch)
    return hidden.flatten(0, 1).index_select(0, rows), batch["completion_ids"][mask], mask


def unflatten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Flat per-token values in mask order -> (B, C) with zeros outside the mask (differentiable)."""
    return torch.zeros(mask.shape, dtype=values.dtype, device=values.device).masked_scatter(mask, values)


def head_inputs(hidden: torch.Tensor, weight: torch.Tensor, dtype: torch.dtype | None):
    """The head's GEMM operands in `dtype` (None: as they are). bf16 on a CPU with bf16 GEMMs is ~2.5x faster than
    fp32; the logits are still accumulated and soft-maxed in fp32, and autograd casts the gradients back."""
    if dtype is None or hidden.dtype == dtype:
        return hidden, weight
    return hidden.to(dtype), weight.to(dtype)


def completion_logprobs(model, batch: dict, temperature: float, chunk_size: int = 1024,
                        head_dtype: torch.dtype | None = None, native: bool = False
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp, entropy), each (B, C) fp32 with zeros outside `completion_mask`, for an align causal LM."""
    hidden, targets, mask = completion_rows(model, batch)
    hidden, weight = head_inputs(hidden, model.lm_head.weight, head_dtype)
    logp, ent = tempered_token_logprobs(hidden, weight, targets, temperature, chunk_size, native)
    return unflatten(logp, mask), unflatten(ent, mask)
