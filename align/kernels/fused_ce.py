"""Fused, chunked linear + cross-entropy: loss and gradients without the full `[tokens, vocab]` logits.

A plain LM head materialises `hidden @ W.T` for every token (2048 tokens x 32768 vocab x 4 B = 268 MB in fp32), its
softmax, and the gradient of both. Here the tokens that carry a label are processed `chunk_size` at a time: for each
chunk the logits are formed, reduced to per-token statistics, turned in place into d(loss)/d(logits), and multiplied
straight into the gradients of `hidden` and `W`. Peak extra memory is one `[chunk_size, vocab]` fp32 buffer (two with
`kernel="torch"`) plus the two gradients (the size of the inputs), whatever the number of tokens.

The per-row passes (max, exp-sum, entropy, d loss / d logits) run in C on a CPU (`kernel="auto"`/"native",
align.kernels.ce_rows: each row read three times while it sits in L2, the logits overwritten by their gradient), in
Triton on a GPU (`"triton"`, or "auto" once its gate passed there: align.kernels.triton_ce, align.kernels.select) or
as torch ops (`"torch"`, and on GPUs without a passed Triton gate). On an AMD EPYC (one thread) the C rows took
13.5 ms for a 430 x 32768 chunk against 52 ms for torch's log_softmax + exp_ + bmm, whose exp runs at ~1 GB/s there
(docs/MEASUREMENTS.md, ladder, 2026-12-04); the three GEMMs are then ~85% of the head.

The gradient is computed during forward (the Liger approach): forward + backward cost three GEMMs, the same as the
unfused head, instead of four for recomputation in backward. Backward only scales the stored gradients by the
incoming scalar. When no input needs a gradient (evaluation, reference scoring), nothing is stored.

Objective per token i with label y_i (rows whose label is `ignore_index` contribute nothing, not even compute):
    ce_i = lse_i - logit_{i, y_i},   lse_i = log sum_v exp(logit_{i, v})
    z_i  = lse_i ** 2                                  (LM-head z-loss, PaLM)
    loss = sum_i ce_i + z_loss_weight * sum_i z_i      (a SUM: the caller divides by its global token count)
    d loss / d logit_{i, v} = softmax_{i, v} * (1 + 2 * z_loss_weight * lse_i) - [v == y_i]
Side outputs (no gradient): the CE sum, the z sum, and the predictive-entropy sum H_i = lse_i - sum_v p_{i, v} logit_{i, v}.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from align.kernels import ce_rows, select, triton_ce

IGNORE_INDEX = -100
KERNELS = ("auto", "native", "torch", "triton")  # the per-row passes: C on a CPU where it builds, Triton, torch ops


@dataclass(frozen=True)
class FusedCEOutput:
    """`loss` is differentiable (sum of ce + z_loss_weight * z); the rest are detached fp32 sums over label tokens."""

    loss: torch.Tensor
    ce_sum: torch.Tensor
    z_sum: torch.Tensor
    entropy_sum: torch.Tensor
    tokens: int


class CEWorkspace:
    """Two reusable `[chunk, vocab]` fp32 buffers (logits, softmax) that outlive one call.

    NOTE: on CPU, glibc returns a freshly freed 128 MB buffer to the OS and the next allocation faults every page in
    again: measured ~150k minor faults and 16% of the head's CPU time per call (2048 tokens, vocab 32768). A
    TrainModule keeps one workspace for the run; GPUs have a caching allocator and gain nothing from it."""

    def __init__(self):
        self._bufs: dict[str, torch.Tensor] = {}

    def get(self, name: str, rows: int, cols: int, device: torch.device) -> torch.Tensor:
        buf = self._bufs.get(name)
        if buf is None or buf.device != device or buf.shape[1] != cols or buf.shape[0] < rows:
            buf = torch.empty(rows, cols, dtype=torch.float32, device=device)
            self._bufs[name] = buf
        return buf[:rows]


def _chunk_stats(logits: torch.Tensor, targets: torch.Tensor, probs: torch.Tensor):
    """Per-row lse, CE and entropy of a `(c, V)` fp32 logits chunk (left untouched), plus the softmax.

    One log_softmax pass gives log p; CE is -log p[y] exactly as torch's cross_entropy computes it, and
    lse = logit[y] - log p[y]. The softmax is then exp'd in place and the entropy H = lse - <p, logits> is one
    row dot: three passes over the chunk instead of five (measured ~2x less elementwise time on CPU)."""
    torch.log_softmax(logits, dim=-1, out=probs)  # (c, V): the one extra buffer besides the logits
    target_logp = probs.gather(1, targets[:, None]).squeeze(1)  # (c,)
    lse = logits.gather(1, targets[:, None]).squeeze(1) - target_logp
    probs.exp_()
    return lse, -target_logp, lse - _row_dots(probs, logits), probs


def _row_dots(probs: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """<p, logits> per row, for the entropy: in C on a CPU where it builds (a metric only: no gradient depends on it),
    else a batched dot, which on a CPU runs as GEMVs at a quarter of memory speed (10% of a tiny SFT step)."""
    if probs.device.type == "cpu" and ce_rows.available():
        return ce_rows.row_dots(probs, logits)
    return torch.bmm(probs[:, None, :], logits[:, :, None]).view(-1)


class _FusedLinearCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, z_loss_weight: float, chunk_size: int, want_h: bool, want_w: bool,
                workspace: CEWorkspace, rows_impl: str):
        # shape: hidden (N, D) label rows only, weight (V, D), targets (N,) in [0, V)
        grad_h = torch.empty_like(hidden) if want_h else None
        grad_w = None  # (V, D) fp32: the first chunk's GEMM writes it, the later ones add to it
        want_grad = want_h or want_w
        sums = torch.zeros(3, dtype=torch.float32, device=hidden.device)  # ce, z, entropy
        rows = torch.arange(min(chunk_size, hidden.shape[0]), device=hidden.device)
        for start in range(0, hidden.shape[0], chunk_size):
            h = hidden[start:start + chunk_size]  # (c, D)
            y = targets[start:start + chunk_size]
            logits = workspace.get("logits", h.shape[0], weight.shape[0], h.device)  # (c, V) fp32
            if h.dtype == torch.float32:
                torch.matmul(h, weight.t(), out=logits)
            else:
                logits.copy_(h @ weight.t())
            native = rows_impl != "torch"
            if native:  # one C / Triton pass per row, in cache; the logits become d loss / d logits in place
                row_pass = ce_rows.ce_rows_ if rows_impl == "native" else triton_ce.ce_rows_
                lse, ce, ent = row_pass(logits, y, z_loss_weight, want_grad)
                probs = logits
            else:
                probs = workspace.get("probs", h.shape[0], weight.shape[0], h.device)
                lse, ce, ent, probs = _chunk_stats(logits, y, probs)
            sums += torch.stack([ce.sum(), (lse * lse).sum(), ent.sum()])
            if not want_grad:
                continue
            if not native:  # probs becomes d loss / d logits in place: p * (1 + 2 z lse) - onehot(y)
                if z_loss_weight:
                    probs.mul_((1.0 + 2.0 * z_loss_weight * lse)[:, None])
                probs[rows[: y.shape[0]], y] -= 1.0
            g = probs.to(hidden.dtype)
            if grad_h is not None:
                torch.matmul(g, weight, out=grad_h[start:start + chunk_size])  # (c, D)
            if want_w:  # (V, D), accumulated in fp32 across chunks
                if h.dtype == torch.float32:
                    grad_w = probs.t() @ h if grad_w is None else grad_w.addmm_(probs.t(), h)
                else:  # low-precision GEMM (tensor cores), fp32 accumulation across chunks
                    part = (g.t() @ h).float()
                    grad_w = part if grad_w is None else grad_w.add_(part)
        if want_w and grad_w is None:  # no label rows
            grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        ctx.save_for_backward(grad_h, grad_w)
        ctx.weight_dtype = weight.dtype
        loss = sums[0] + z_loss_weight * sums[1]
        ce_sum, z_sum, ent_sum = sums.unbind(0)
        ctx.mark_non_differentiable(ce_sum, z_sum, ent_sum)
        return loss, ce_sum, z_sum, ent_sum

    @staticmethod
    def backward(ctx, grad_loss, *_unused):
        grad_h, grad_w = ctx.saved_tensors
        if grad_h is not None:
            grad_h = grad_h * grad_loss.to(grad_h.dtype)
        if grad_w is not None:
            grad_w = (grad_w * grad_loss).to(ctx.weight_dtype)
        return grad_h, grad_w, None, None, None, None, None, None, None


def fused_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *,
                               z_loss_weight: float = 0.0, chunk_size: int = 1024,
                               ignore_index: int = IGNORE_INDEX, workspace: CEWorkspace | None = None,
                               kernel: str = "auto") -> FusedCEOutput:
    """Summed CE (+ z-loss) of `hidden @ weight.T` against `labels`, never holding more than a chunk of logits.

    hidden: (..., D) already aligned with labels (..., ): position i predicts labels[i] (shift before calling).
    weight: (V, D), the LM head (tied or not). Labels equal to `ignore_index` are skipped before any GEMM.
    workspace: buffers to reuse across calls (a TrainModule's); None allocates them for this call only.
    kernel: "auto" | "native" | "torch" | "triton", where the per-row passes run (`rows_kernel`)."""
    return fused_head(hidden, weight, labels, rows_kernel(kernel, hidden.device), z_loss_weight=z_loss_weight,
                      chunk_size=chunk_size, ignore_index=ignore_index, workspace=workspace)


def fused_head(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, row_impl: str, *,
               z_loss_weight: float = 0.0, chunk_size: int = 1024, ignore_index: int = IGNORE_INDEX,
               workspace: CEWorkspace | None = None) -> FusedCEOutput:
    """`fused_linear_cross_entropy` with the row passes named outright ("native" | "triton" | "torch"), no selection:
    what the equivalence gate (align/model/kernel_gates.py) runs on both sides."""
    if row_impl not in ("native", "triton", "torch"):
        raise ValueError(f"row_impl must be 'native', 'triton' or 'torch', got {row_impl!r}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    flat_h = hidden.reshape(-1, hidden.shape[-1])  # shape: (N, D)
    flat_y = labels.reshape(-1)
    if flat_h.shape[0] != flat_y.shape[0]:
        raise ValueError(f"hidden has {flat_h.shape[0]} rows but labels has {flat_y.shape[0]}")
    keep = (flat_y != ignore_index).nonzero().squeeze(1)
    targets = flat_y.index_select(0, keep)
    if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= weight.shape[0]):
        raise ValueError(f"labels must lie in [0, {weight.shape[0]}) or equal {ignore_index}")
    rows = flat_h.index_select(0, keep)  # (n_label, D); gradient flows back to the kept rows only
    grad_on = torch.is_grad_enabled()  # NOTE: Function.forward always runs with grad off; decide out here
    loss, ce, z, ent = _FusedLinearCE.apply(rows, weight, targets, float(z_loss_weight), int(chunk_size),
                                            grad_on and rows.requires_grad, grad_on and weight.requires_grad,
                                            workspace if workspace is not None else CEWorkspace(), row_impl)
    return FusedCEOutput(loss=loss, ce_sum=ce, z_sum=z, entropy_sum=ent, tokens=int(targets.numel()))


def rows_kernel(kernel: str, dev: torch.device) -> str:
    """Where the per-row passes run: "triton" ("triton" demands it; "auto" on CUDA once its gate passed:
    align.kernels.select), else "native" or "torch" as `use_native` decides (a CPU's "auto" is unchanged)."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if kernel in ("auto", "triton") and select.resolve("fused_ce", kernel, dev) == "triton":
        return "triton"
    return "native" if use_native(kernel, dev) else "torch"


def use_native(kernel: str, dev: torch.device) -> bool:
    """Whether the per-row passes run in C (align.kernels.ce_rows): "native" demands it (CPU only; raises where it
    cannot be built), "torch" and "triton" never, "auto" on a CPU where the C build works."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if kernel in ("torch", "triton") or (kernel == "auto" and dev.type != "cpu"):
        return False
    if dev.type != "cpu":
        raise ValueError(f"kernel 'native' runs on a CPU, the head is on {dev}")
    if kernel == "native":
        ce_rows.lib()  # NativeUnavailable with the compiler's reason
        return True
    return ce_rows.available()


def reference_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *,
                                   z_loss_weight: float = 0.0, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """The unfused formula (full logits, autograd): what the fused path must equal. For tests and benchmarks."""
    logits = (hidden.reshape(-1, hidden.shape[-1]) @ weight.t()).float()  # (N, V)
    y = labels.reshape(-1)
    ce = torch.nn.functional.cross_entropy(logits, y, ignore_index=ignore_index, reduction="sum")
    lse = torch.logsumexp(logits, dim=-1)[y != ignore_index]
    return ce + z_loss_weight * (lse * lse).sum()
