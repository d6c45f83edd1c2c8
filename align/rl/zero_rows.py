"""Rows of a GRPO rollout whose loss and gradient are exactly zero, and the optimizer-step windows without them.

Under the tiny recipe (`[advantage] negative_scale = 0`, no KL) the wrong samples (~36%) and the zero-variance
groups that fill a short rollout carry advantage 0: the head already skips their gradient GEMMs
(align.rl.fused_objective), but the trunk forward and backward would still run on them. `[loss] zero_gradient_rows =
"skip"` leaves them out of the training micro-batches; their loss units still count in the window's normaliser and
their row counts (reward, correct, truncated, lengths) in the statistics, so the step's gradient is the same sum
over the same denominator (only the float summation order and the padding of the forwards change bits).

Every rank must run the same number of forwards and backwards (DDP's gradient all-reduce sits in the last backward,
FSDP2 gathers parameters in every forward, and the pi_old scoring goes through the same wrapped unit), so the number
of micro-batches of each window, and of scoring passes, is the MAX over ranks (one small all-reduce each, in the
batch source); a rank with fewer rows that train cuts them into more, smaller micro-batches, and a micro-batch left
with no row takes one of the dropped rows back (ballast: its gradient is 0, its forward statistics count). A window
whose every row is dropped is thus one micro-batch of one dropped row per rank: the same empty step as before."""

from __future__ import annotations

from typing import Callable

import torch

from align.rl.grpo_loss import GrpoLossConfig

CRITIC_KEYS = ("token_advantages", "returns", "old_values")  # PPO's per-token terms: such a row always trains
SKIPPED_KEYS = ("loss_mask", "completion_mask", "completion_start", "advantages", "rewards", "correct", "truncated",
                "weight_version")  # what the statistics of a row left out need (align.rl.grpo_module)

RowRule = Callable[[dict], torch.Tensor]  # batch -> (N,) bool: the rows left out of the training forward


def zero_gradient_rows(batch: dict, loss: GrpoLossConfig, moe_aux: tuple[float, float] = (0.0, 0.0)) -> torch.Tensor:
    """(N,) bool: the rows whose every per-token loss and gradient is exactly 0 under `loss`.

    Why exact: a row's per-token loss (align.rl.grpo_loss.policy_terms) is
        l_t = -min(r_t A, clip(r_t) A) * w_t + kl_beta * k3_t,   summed with the weight m_t (loss_mask)
    (GSPO's sequence ratio and the dual clip only change r). With A = 0 both arms of the min are 0 for any finite r,
    so the surrogate and its derivative vanish (with step credit, A is the row's plus its per-token step advantage:
    0 on every loss token), and with kl_beta = 0 nothing else is left; with m_t = 0 on every
    token (a truncated completion under `truncated = "mask"`) the row's sum is 0 whatever l is, KL included. The
    only other terms of a GRPO step act on every forwarded token without an advantage: the MoE router's load-balance
    and z losses (`moe_aux`, the stage's (load_balance, z_loss) coefficients); with either > 0 no row is dropped.
    A PPO row (per-token GAE advantages, a critic loss on every token: CRITIC_KEYS) is never dropped.
    NOTE: "finite" matters: a row whose forward would overflow (r = inf, inf * 0 = NaN) made the old step
    non-finite; dropped, it is not seen. The kept rows share the weights, so a diverging model is still caught."""
    n = batch["completion_ids"].shape[0]
    if any(moe_aux) or any(key in batch for key in CRITIC_KEYS):
        return torch.zeros(n, dtype=torch.bool)
    dropped = batch["loss_mask"].sum(1) == 0
    if loss.kl_beta == 0:
        silent = batch["advantages"] == 0
        if "step_advantages" in batch:  # step credit (align.rl.step_credit): A is per token, 0 on none of them
            silent &= ((batch["step_advantages"] != 0) & (batch["loss_mask"] != 0)).sum(1) == 0
        dropped |= silent
    return dropped


def row_rule(loss: GrpoLossConfig, moe_aux: tuple[float, float]) -> RowRule | None:
    """The batch source's rule for `[loss] zero_gradient_rows` (None, "train": every row trains, as before)."""
    if loss.zero_gradient_rows == "train":
        return None
    return lambda batch: zero_gradient_rows(batch, loss, moe_aux)


def split_window(window: list[torch.Tensor], dropped: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(kept, left out) row indices of one planned window (align.rl.assembly.plan_windows), each in the window's
    length-descending order."""
    rows = torch.cat(window)
    out = dropped[rows]
    return rows[~out], rows[out]


def micro_count(kept: int, micro_batch_size: int) -> int:
    """Micro-batches this rank needs for `kept` rows (at least 1: a window is never empty for the Trainer)."""
    return max(1, -(-kept // micro_batch_size))


def cut_window(kept: torch.Tensor, left_out: torch.Tensor, count: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """`count` micro-batches (agreed by every rank, >= this rank's micro_count) of the kept rows, cut evenly; each
    micro-batch left without a kept row takes the shortest left-out row as ballast. Returns (micro-batches, the
    rows still left out). count <= the window's rows, so there are always enough left-out rows for the ballast."""
    pieces = list(torch.tensor_split(kept, count))
    empty = [i for i, piece in enumerate(pieces) if piece.numel() == 0]
    n = left_out.numel()
    for j, i in enumerate(empty):  # the shortest left-out row first (left_out is length-descending)
        pieces[i] = left_out[n - 1 - j:n - j]
    return pieces, left_out[:n - len(empty)]


def skipped_rows(batch: dict, rows: torch.Tensor) -> dict[str, torch.Tensor]:
    """The left-out rows' columns that their statistics and loss units need (no forward)."""
    return {key: batch[key].index_select(0, rows) for key in SKIPPED_KEYS}
