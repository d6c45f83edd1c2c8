"""Per-sequence summed log-probs from hidden states and the LM head, in chunks, without the `[tokens, vocab]` logits.

DPO (and reference scoring) needs one number per sequence: sum_i log p(y_i | x, y_<i) over the completion tokens.
A plain head materialises `hidden @ W.T` for every position, its log-softmax, and the gradients of both (for the
tiny profile's 8 sequences x 192 tokens x 32768 vocab that is 200 MB per buffer in fp32). Here only the positions
that carry a label pass through the head, `chunk_size` rows at a time:

    forward, per chunk:   logits = h W^T (fp32),  lse = logsumexp(logits),  logp_i = logits_{i, y_i} - lse_i
    backward, per chunk:  the logits are recomputed from the saved rows and lse, then with g_i = d loss / d logp_i
                          d loss / d logits_i = g_i * (onehot(y_i) - softmax_i)
                          grad_h_i = (d loss / d logits_i) W,    grad_W += (d loss / d logits)^T h   (fp32 sum)

Why recompute instead of computing gradients in forward (as align.kernels.fused_ce does): a DPO loss couples the
two arms of a pair through a sigmoid, so g_i is unknown until every sequence is scored, and grad_W cannot be
scaled after the fact per sequence without one (V, D) buffer per sequence. The cost is one extra head GEMM per
training step (4 instead of 3); the reward is that peak extra memory is one (chunk, V) fp32 buffer. Under
`torch.no_grad()` (the reference cache) nothing is saved and forward is one GEMM per chunk.

Label convention: `labels[b, t]` is the token that `hidden[b, t]` predicts (already shifted). `next_token_labels`
turns input-aligned labels (transformers' convention, where the model shifts) into this form.

`kernel` ("auto" | "torch" | "triton", align.kernels.select, name "seq_logprob"): the per-row passes (logsumexp in
forward, the in-place softmax gradient in backward) in torch ops, or one Triton program per row (align.kernels
.triton_ce); "auto" is torch on a CPU and Triton on CUDA once its equivalence gate passed there."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from align.kernels import select, triton_ce

IGNORE_INDEX = -100
ARMS = ("chosen", "rejected")


@dataclass(frozen=True)
class SequenceLogprobs:
    logps: torch.Tensor  # (B,) fp32 (fp64 for fp64 inputs) summed log-probs of the labelled tokens; differentiable
    tokens: torch.Tensor  # (B,) int64 number of labelled tokens


def _acc_dtype(t: torch.Tensor) -> torch.dtype:
    """Accumulation dtype: fp32 for fp32/bf16/fp16 inputs, fp64 for fp64 (tests and gradcheck)."""
    return torch.promote_types(t.dtype, torch.float32)


class _ChunkedTokenLogprob(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_size: int, use_triton: bool):
        # shape: hidden (N, D) labelled rows only, weight (V, D), targets (N,) in [0, V) -> logp (N,) fp32
        n, acc = hidden.shape[0], _acc_dtype(hidden)
        logp = torch.empty(n, dtype=acc, device=hidden.device)
        lse = torch.empty(n, dtype=acc, device=hidden.device)
        for start in range(0, n, chunk_size):
            stop = min(start + chunk_size, n)
            logits = (hidden[start:stop] @ weight.t()).to(acc)  # (c, V)
            if use_triton:  # one program per row: lse and lse - logit_y, no second (c, V) pass in torch
                lse[start:stop], ce, _ = triton_ce.ce_rows_(logits, targets[start:stop], 0.0, False)
                logp[start:stop] = -ce
                continue
            target_logit = logits.gather(1, targets[start:stop, None]).squeeze(1)
            # logsumexp in place (torch.logsumexp allocates a second (c, V) buffer)
            peak = logits.amax(dim=-1)
            chunk_lse = logits.sub_(peak[:, None]).exp_().sum(dim=-1).log_().add_(peak)
            lse[start:stop] = chunk_lse
            logp[start:stop] = target_logit - chunk_lse
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.chunk_size, ctx.use_triton = chunk_size, use_triton
        return logp

    @staticmethod
    def backward(ctx, grad_logp):
        hidden, weight, targets, lse = ctx.saved_tensors
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(hidden) if want_h else None
        acc = lse.dtype
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if want_w else None
        grad_logp = grad_logp.to(acc)
        for start in range(0, hidden.shape[0], ctx.chunk_size):
            stop = min(start + ctx.chunk_size, hidden.shape[0])
            h, y, g = hidden[start:stop], targets[start:stop], grad_logp[start:stop]
            dlogits = (h @ weight.t()).to(acc)  # (c, V), recomputed
            if ctx.use_triton:  # in place: -g * (softmax - onehot) in one pass per row
                triton_ce.softmax_grad_rows_(dlogits, y, lse[start:stop], -g)
            else:  # in place: softmax, then g * (onehot - softmax)
                dlogits.sub_(lse[start:stop, None]).exp_().mul_(-g[:, None])
                dlogits[torch.arange(stop - start, device=y.device), y] += g
            if grad_h is not None:
                torch.matmul(dlogits.to(hidden.dtype), weight, out=grad_h[start:stop])  # (c, D)
            if grad_w is not None:
                if h.dtype == acc:
                    grad_w.addmm_(dlogits.t(), h)
                else:  # low-precision GEMM, fp32 accumulation across chunks
                    grad_w.add_(dlogits.to(h.dtype).t() @ h)
        if grad_w is not None:
            grad_w = grad_w.to(weight.dtype)
        return grad_h, grad_w, None, None, None


def next_token_labels(labels: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """Input-aligned labels (B, T) -> labels aligned with the hidden state that predicts them (B, T): position t gets
    labels[t + 1], the last position gets `ignore_index`."""
    shifted = torch.full_like(labels, ignore_index)
    shifted[:, :-1] = labels[:, 1:]
    return shifted


def sequence_logprobs(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *, chunk_size: int = 1024,
                      ignore_index: int = IGNORE_INDEX, kernel: str = "auto") -> SequenceLogprobs:
    """Summed log p(labels) per sequence. hidden (B, T, D), weight (V, D), labels (B, T) aligned with hidden."""
    fp32_rows = _acc_dtype(hidden) == torch.float32  # fp64 (tests, gradcheck): torch, unless asked otherwise
    use_triton = (fp32_rows or kernel == "triton") and select.resolve("seq_logprob", kernel, hidden.device) == "triton"
    return sequence_logprobs_rows(hidden, weight, labels, use_triton, chunk_size=chunk_size, ignore_index=ignore_index)


def sequence_logprobs_rows(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, use_triton: bool, *,
                           chunk_size: int = 1024, ignore_index: int = IGNORE_INDEX) -> SequenceLogprobs:
    """`sequence_logprobs` with the row passes named outright (Triton or torch), no selection: what the equivalence
    gate (align/model/kernel_gates.py) runs on both sides."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if hidden.shape[:2] != labels.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} and labels {tuple(labels.shape)} disagree on (B, T)")
    b, t = labels.shape
    flat_y = labels.reshape(-1)
    keep = (flat_y != ignore_index).nonzero().squeeze(1)  # (n,) flat positions that carry a label
    targets = flat_y.index_select(0, keep)
    if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= weight.shape[0]):
        raise ValueError(f"labels must lie in [0, {weight.shape[0]}) or equal {ignore_index}")
    rows = hidden.reshape(b * t, -1).index_select(0, keep)  # (n, D)
    if use_triton and _acc_dtype(hidden) != torch.float32:
        raise ValueError(f"the Triton log-prob rows accumulate in fp32; hidden is {hidden.dtype}")
    logp = _ChunkedTokenLogprob.apply(rows, weight, targets, int(chunk_size), use_triton)  # (n,)
    seq = torch.div(keep, t, rounding_mode="floor")
    sums = torch.zeros(b, dtype=logp.dtype, device=hidden.device).index_add(0, seq, logp)
    return SequenceLogprobs(logps=sums, tokens=torch.bincount(seq, minlength=b))


def model_sequence_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor, *,
                            chunk_size: int = 1024, kernel: str = "auto") -> SequenceLogprobs:
    """Score a batch with an align causal LM (`forward_hidden` + `lm_head`): input-aligned labels, -100 = unscored."""
    hidden = model.forward_hidden(input_ids, attention_mask)  # (B, T, D)
    return sequence_logprobs(hidden, model.lm_head.weight, next_token_labels(labels), chunk_size=chunk_size,
                             kernel=kernel)


@dataclass(frozen=True)
class PairLogprobs:
    chosen: torch.Tensor  # (B,) summed completion log-probs, differentiable when grad is on
    rejected: torch.Tensor
    chosen_tokens: torch.Tensor  # (B,) int64
    rejected_tokens: torch.Tensor


def stack_arms(batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A preference batch (docs/CONTRACTS.md) as chosen rows then rejected rows, right-padded to one length:
    input_ids, attention_mask, labels, each (2B, T)."""
    t = max(batch[f"{arm}_input_ids"].shape[1] for arm in ARMS)

    def pad(key: str, value) -> torch.Tensor:
        x = batch[key]
        return F.pad(x, (0, t - x.shape[1]), value=value)

    ids = torch.cat([pad(f"{a}_input_ids", 0) for a in ARMS])
    mask = torch.cat([pad(f"{a}_attention_mask", False) for a in ARMS]).bool()
    labels = torch.cat([pad(f"{a}_labels", IGNORE_INDEX) for a in ARMS])
    return ids, mask, labels


def pair_logprobs(model, batch: dict, chunk_size: int = 1024, kernel: str = "auto") -> PairLogprobs:
    """Both arms of every pair of a preference batch scored in ONE forward of `model` (on the model's device)."""
    dev = model.lm_head.weight.device
    ids, mask, labels = (x.to(dev) for x in stack_arms(batch))  # shape: (2B, T)
    seq = model_sequence_logprobs(model, ids, mask, labels, chunk_size=chunk_size, kernel=kernel)
    chosen, rejected = seq.logps.chunk(2)
    chosen_tokens, rejected_tokens = seq.tokens.chunk(2)
    return PairLogprobs(chosen, rejected, chosen_tokens, rejected_tokens)


def reference_sequence_logprobs(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                                ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """The unfused formula (full logits, autograd), what the fused path must equal. For tests and benchmarks."""
    logits = (hidden @ weight.t()).to(_acc_dtype(hidden))  # (B, T, V)
    mask = labels != ignore_index
    logp = torch.log_softmax(logits, dim=-1).gather(2, labels.clamp(min=0)[..., None]).squeeze(2)  # (B, T)
    return (logp * mask).sum(1)
