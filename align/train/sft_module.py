"""`SftTrainModule`: the TrainModule of the SFT stage, the smallest example of the loss seam."""

from __future__ import annotations

from torch import nn

from align.kernels.fused_ce import CEWorkspace

from align.train.sft_loss import SftLossConfig, count_loss_tokens, sft_loss, sft_metrics
from align.train.train_module import LossOutput, TrainModule, TrainModuleConfig


class SftTrainModule(TrainModule):
    """Next-token CE on masked labels, normalised by the global label-token count of the window."""

    def __init__(self, model: nn.Module, cfg: TrainModuleConfig, loss_cfg: SftLossConfig, total_steps: int,
                 seed: int = 0):
        self.loss_cfg = loss_cfg  # set before super().__init__: wrapping binds self.loss
        self.workspace = CEWorkspace()  # the fused head's [chunk, vocab] buffers, reused by every micro-batch
        super().__init__(model, cfg, total_steps, seed)

    def loss(self, model: nn.Module, batch: dict) -> LossOutput:
        return sft_loss(model, batch, self.loss_cfg, self.workspace)

    def loss_units(self, batch: dict) -> float:
        return float(count_loss_tokens(batch))

    def log_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        return sft_metrics(sums)
