"""`PairTrainModule`: what the TrainModules on preference batches (DPO's `DpoTrainModule`, the reward model's
`RmTrainModule`) share: the loss unit is a pair, and `score` runs a batch flagged `SCORE_ONLY` through the wrapped
unit in eval mode without gradients, where the subclass's `loss` returns its per-pair scores instead of a loss."""

from __future__ import annotations

import torch

from align.train.train_module import TrainModule

SCORE_ONLY = "_score_only"  # batch flag: `loss` returns the pair scores (log-probs, rewards) instead of a loss


class PairTrainModule(TrainModule):
    """Base of the preference-pair modules; a subclass's `loss` must answer a batch carrying SCORE_ONLY."""

    def loss_units(self, batch: dict) -> float:
        return float(batch["pair_index"].numel())

    @torch.no_grad()
    def score(self, batch: dict):
        """The subclass's scores of a batch in eval mode, through the wrapped unit: under FSDP2 the root parameters
        (embeddings, head) are only gathered inside its forward. Collective: every rank must score the same number
        of batches."""
        self.net.eval()
        try:
            return self.net({**batch, SCORE_ONLY: True})
        finally:
            self.net.train()
