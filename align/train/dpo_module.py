"""`DpoTrainModule`: DPO on the TrainModule seam, with reference log-probs read from the cache, never computed.

A preference batch (docs/CONTRACTS.md: chosen_/rejected_ input_ids, labels, attention_mask, and pair_index) is
scored in ONE forward of the policy: the two arms are stacked to (2B, T) and the summed completion log-probs come
from the fused chunked head (align.kernels.fused_dpo), so no [tokens, vocab] logits exist. The reference arm is a
lookup by pair_index in an open `RefCache`; the reference model is not loaded during training.

Normalisation on the seam: the loss unit is a pair. `loss` returns the SUM over the micro-batch's pairs of
dpo_loss's per-pair mean, i.e. P * (mean_i l_i + alpha * nll); the TrainModule divides by the window's global pair
count. The preference term is therefore exact over any accumulation window; the NLL term is the pair-weighted
mean of each micro-batch's chosen-token mean (equal to TRL's token mean when a window is one micro-batch)."""

from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch import nn

from align.exceptions import DataError
from align.kernels.fused_dpo import ARMS, PairLogprobs, pair_logprobs
from align.train.dpo_loss import DpoLossConfig, dpo_loss
from align.train.ref_cache import RefCache
from align.train.pair_module import SCORE_ONLY, PairTrainModule
from align.train.train_module import LossOutput, TrainModuleConfig

SUM_KEYS = ("pairs", "objective_sum", "pref_loss_sum", "nll_sum", "chosen_reward_sum", "rejected_reward_sum",
            "margin_sum", "correct", "chosen_logps_sum", "rejected_logps_sum", "input_tokens")


def check_tokens_match(cache: RefCache, pair_index: torch.Tensor, scored: PairLogprobs) -> None:
    """The cache's completion lengths must be the batch's: otherwise the cache was built from other shards."""
    cached = cache.tokens(pair_index.cpu())
    for arm, mine, theirs in zip(ARMS, (scored.chosen_tokens, scored.rejected_tokens), cached, strict=True):
        bad = (mine.cpu() != theirs.long()).nonzero()
        if bad.numel():
            i = int(bad[0])
            raise DataError(f"pair_index {int(pair_index[i])}: the batch has {int(mine[i])} {arm} completion tokens, "
                            f"the reference cache {cache.path} has {int(theirs[i])}; cache and shards disagree")


class DpoTrainModule(PairTrainModule):
    """Sigmoid DPO (+ label smoothing, DPOP, NLL mix) against cached reference log-probs."""

    def __init__(self, model: nn.Module, cfg: TrainModuleConfig, loss_cfg: DpoLossConfig, ref_cache: RefCache,
                 total_steps: int, seed: int = 0, cache_rows: torch.Tensor | None = None):
        """`cache_rows` maps a batch's pair_index to the cache row when the loader reads a subset of the pairs the
        cache was built for (pair_index i is cache row cache_rows[i]); None: they are the same rows."""
        self.loss_cfg, self.ref_cache = loss_cfg, ref_cache  # set before super().__init__: wrapping binds self.loss
        self.cache_rows = cache_rows
        super().__init__(model, cfg, total_steps, seed)

    def loss(self, model: nn.Module, batch: dict) -> LossOutput | PairLogprobs:
        if batch.get(SCORE_ONLY):
            return pair_logprobs(model, {k: v for k, v in batch.items() if k != SCORE_ONLY}, self.loss_cfg.chunk_size)
        policy = pair_logprobs(model, batch, self.loss_cfg.chunk_size)
        rows = batch["pair_index"].cpu()
        rows = self.cache_rows[rows] if self.cache_rows is not None else rows
        check_tokens_match(self.ref_cache, rows, policy)
        ref = self.ref_cache.lookup(rows)
        dev = policy.chosen.device
        out = dpo_loss(policy.chosen, policy.rejected, ref.chosen.to(dev), ref.rejected.to(dev), self.loss_cfg,
                       chosen_tokens=policy.chosen_tokens)
        pairs = float(policy.chosen.shape[0])
        margins = out.chosen_rewards - out.rejected_rewards
        values = (pairs, out.loss.detach() * pairs, out.per_pair.detach().sum(), out.nll * pairs,
                  out.chosen_rewards.sum(), out.rejected_rewards.sum(), margins.sum(), (margins > 0).sum(),
                  policy.chosen.detach().sum(), policy.rejected.detach().sum(),
                  batch["chosen_attention_mask"].sum() + batch["rejected_attention_mask"].sum())
        sums = {k: torch.as_tensor(v, dtype=torch.float32, device=dev) for k, v in zip(SUM_KEYS, values, strict=True)}
        return LossOutput(loss=out.loss * pairs, sums=sums)

    def log_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        return dpo_window_metrics(sums)


def dpo_window_metrics(sums: dict[str, float]) -> dict[str, float]:
    """Per-pair means of a window's global sums (NaN for an empty window)."""
    pairs = sums.get("pairs", 0.0)

    def mean(key: str) -> float:
        return sums[key] / pairs if pairs else float("nan")

    return {"loss": mean("objective_sum"), "pref_loss": mean("pref_loss_sum"), "nll": mean("nll_sum"),
            "rewards/chosen": mean("chosen_reward_sum"), "rewards/rejected": mean("rejected_reward_sum"),
            "rewards/margin": mean("margin_sum"), "rewards/accuracy": mean("correct"),
            "logps/chosen": mean("chosen_logps_sum"), "logps/rejected": mean("rejected_logps_sum"), "pairs": pairs,
            "input_tokens": sums.get("input_tokens", 0.0)}


def model_scorer(model: nn.Module, chunk_size: int) -> Callable[[dict], PairLogprobs]:
    """A `score` for `preference_eval` from a plain (unwrapped) model, in eval mode without gradients."""

    @torch.no_grad()
    def score(batch: dict) -> PairLogprobs:
        was_training = model.training
        model.eval()
        try:
            return pair_logprobs(model, batch, chunk_size)
        finally:
            model.train(was_training)

    return score


def preference_eval(score: Callable[[dict], PairLogprobs], batches: Iterable[dict], beta: float,
                    ref_cache: RefCache | None = None) -> dict[str, float]:
    """Held-out preference metrics of the policy behind `score` (`DpoTrainModule.score` or `model_scorer`).

    `preference_accuracy`: fraction of pairs with log pi(y_c|x) > log pi(y_r|x), the model's own preference,
    comparable between checkpoints (the SFT checkpoint's value comes from its reference cache alone).
    With `ref_cache`: DPO's implicit-reward accuracy (rho_c > rho_r) and mean reward margin as well. The batches'
    pair_index must be cache rows."""
    n = correct = reward_correct = margin = 0.0
    for batch in batches:
        scored = score(batch)
        chosen, rejected = scored.chosen.float().cpu(), scored.rejected.float().cpu()
        n += chosen.shape[0]
        correct += float((chosen > rejected).sum())
        if ref_cache is not None:
            rows = batch["pair_index"].cpu()
            check_tokens_match(ref_cache, rows, scored)
            ref = ref_cache.lookup(rows)
            m = beta * ((chosen - ref.chosen) - (rejected - ref.rejected))
            reward_correct += float((m > 0).sum())
            margin += float(m.sum())
    out = {"pairs": n, "preference_accuracy": correct / n if n else float("nan")}
    if ref_cache is not None:
        out.update({"reward_accuracy": reward_correct / n if n else float("nan"),
                    "reward_margin": margin / n if n else float("nan")})
    return out
