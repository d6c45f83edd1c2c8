"""Supervised fine-tuning loss: next-token cross-entropy on masked labels, summed, plus an optional LM-head z-loss.

Labels follow the transformers convention: `labels` is aligned with `input_ids` (-100 where no loss is taken) and
position i predicts labels[i + 1]; the shift happens here. The loss is a SUM over label tokens. The TrainModule
divides it by the number of label tokens in the whole accumulation window on all ranks (`count_loss_tokens` is that
count for one micro-batch), so a window of any shape has the gradient of one big batch.

The head is fused (align.kernels.fused_ce): the `[tokens, vocab]` logits are never materialised; `fused = false`
uses the plain head (full logits, autograd) and exists to check the fused one (its logged `ce_sum` includes the
z term, and it reports no entropy)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from align.kernels.fused_ce import IGNORE_INDEX, CEWorkspace, fused_linear_cross_entropy, reference_linear_cross_entropy
from align.train.train_module import LossOutput


@dataclass(frozen=True)
class SftLossConfig:
    """[loss] table of the SFT stage."""

    z_loss_weight: float = 0.0  # weight of mean(lse^2) over label tokens (PaLM uses 1e-4); 0 disables
    chunk_size: int = 1024  # label tokens per logits chunk in the fused head: bounds memory at chunk x vocab x 4 B
    fused: bool = True  # false: plain full-logits head (reference path)
    # the fused head's per-row passes (softmax statistics, d loss / d logits): "native" in C (align.kernels.ce_rows),
    # "torch" in torch ops, "auto": native on a CPU where the C build works (4x less time there), else Triton on CUDA
    # once its gate passed (align.kernels.select), else torch; "triton" demands the Triton rows
    kernel: Literal["auto", "native", "torch", "triton"] = "auto"

    def __post_init__(self):
        if self.z_loss_weight < 0:
            raise ValueError(f"z_loss_weight must be >= 0, got {self.z_loss_weight}")
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {self.chunk_size}")


def shift_labels(labels: torch.Tensor) -> torch.Tensor:
    """(B, T) labels aligned with inputs -> (B, T) targets: targets[:, i] = labels[:, i + 1], the last one ignored."""
    out = torch.full_like(labels, IGNORE_INDEX)
    out[:, :-1] = labels[:, 1:]
    return out


def count_loss_tokens(batch: dict) -> int:
    """Label tokens this micro-batch contributes (the loss's normalisation units)."""
    return int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())


def sft_loss(model: nn.Module, batch: dict, cfg: SftLossConfig, workspace: CEWorkspace | None = None) -> LossOutput:
    """Summed next-token CE (+ z-loss) of `model` on `batch`; `sums` carries ce, z, entropy and token counts.
    `workspace`: the fused head's reusable buffers (kept by the TrainModule across micro-batches)."""
    # packed rows (align.data.collate_packed) carry document_ids: attention and RoPE then restart per document
    packed = {"document_ids": batch["document_ids"]} if "document_ids" in batch else {}
    hidden = model.forward_hidden(batch["input_ids"], batch.get("attention_mask"), batch.get("position_ids"),
                                  **packed)
    targets = shift_labels(batch["labels"])  # shape: (B, T), aligned with hidden
    weight = model.lm_head.weight
    mask = batch.get("attention_mask")
    inputs = float(mask.sum()) if mask is not None else float(batch["input_ids"].numel())
    if cfg.fused:
        out = fused_linear_cross_entropy(hidden, weight, targets, z_loss_weight=cfg.z_loss_weight,
                                         chunk_size=cfg.chunk_size, workspace=workspace, kernel=cfg.kernel)
        loss, tokens = out.loss, float(out.tokens)
        sums = {"ce_sum": out.ce_sum, "z_sum": out.z_sum, "entropy_sum": out.entropy_sum}
    else:
        loss = reference_linear_cross_entropy(hidden, weight, targets, z_loss_weight=cfg.z_loss_weight)
        tokens = float((targets != IGNORE_INDEX).sum())
        sums = {"ce_sum": loss.detach()}
    sums["tokens"] = torch.tensor(tokens, device=loss.device)
    sums["input_tokens"] = torch.tensor(inputs, device=loss.device)
    return LossOutput(loss=loss, sums=sums)


def sft_metrics(sums: dict[str, float]) -> dict[str, float]:
    """Window metrics from global sums: per-token means (NaN when the window had no label tokens)."""
    tokens = sums.get("tokens", 0.0)
    per_token = (lambda key: sums[key] / tokens if tokens else float("nan"))
    out = {"loss": per_token("ce_sum"), "loss_tokens": tokens, "input_tokens": sums.get("input_tokens", 0.0)}
    if "z_sum" in sums:
        out["z_loss"] = per_token("z_sum")
    if "entropy_sum" in sums:
        out["entropy"] = per_token("entropy_sum")
    return out
