"""`RmTrainModule`: a Bradley-Terry reward model on the TrainModule seam.

The critic is an align `MistralForValueHead` (HF MistralForSequenceClassification layout, num_labels=1). A pair's
reward for one arm is the score head applied to the final-normed hidden state of that arm's LAST non-padding token
(`sequence_rewards`; transformers picks the same position, from `input_ids != pad_token_id` where align reads the
attention mask, so a content token equal to the pad id cannot move it). Both arms of a preference batch (docs/
CONTRACTS.md) are stacked to (2B, T) and scored in ONE forward, as DpoTrainModule does; the head runs on the 2B
gathered rows only, never on (2B, T).

Normalisation on the seam: the loss unit is a pair; `loss` returns the SUM of the per-pair loss (rm_loss), the
TrainModule divides by the window's global pair count, so a window's loss is the exact mean over its pairs.
Logged: loss, the Bradley-Terry term alone, accuracy (fraction of pairs with r_c > r_r), the mean margin r_c - r_r
and the mean rewards of each arm (a drifting mean is what the centering term is for)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import torch
from torch import nn

from align.exceptions import CheckpointError
from align.kernels.fused_dpo import stack_arms
from align.model.checkpoint import load_weights_into, resolve_checkpoint_dir
from align.model.family import family_of_config
from align.model.config_io import load_hf_config
from align.reward.rm_loss import RmLossConfig, rm_loss
from align.train.pair_module import SCORE_ONLY, PairTrainModule
from align.train.train_module import LossOutput, TrainModuleConfig

SUM_KEYS = ("pairs", "objective_sum", "bt_sum", "correct", "margin_sum", "chosen_reward_sum", "rejected_reward_sum",
            "input_tokens")


@dataclass(frozen=True)
class PairRewards:
    chosen: torch.Tensor  # (B,) fp32 rewards, differentiable when grad is on
    rejected: torch.Tensor


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B,) position of each row's last attended token (transformers' argmax over index * mask; 0 for an empty row)."""
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    return (positions * attention_mask.long()).argmax(-1)


def sequence_rewards(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """(B,) fp32 reward of each row: `model.score` on the hidden state of its last attended token."""
    hidden = model.forward_hidden(input_ids, attention_mask)  # (B, T, D)
    last = last_token_index(attention_mask)
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    return model.score(hidden[rows, last]).squeeze(-1).float()


def pair_rewards(model: nn.Module, batch: dict) -> PairRewards:
    """Both arms of every pair scored in ONE forward of `model` (on the model's device)."""
    dev = model.score.weight.device
    ids, mask, _ = (x.to(dev) for x in stack_arms(batch))  # (2B, T)
    chosen, rejected = sequence_rewards(model, ids, mask).chunk(2)
    return PairRewards(chosen, rejected)


def critic_from_policy(policy_dir, *, dtype: torch.dtype = torch.float32, device="cpu", seed: int = 0,
                       head: str = "ForSequenceClassification") -> nn.Module:
    """The family's critic whose HF architecture ends with `head` (Mistral: "ForSequenceClassification" ->
    `MistralForValueHead`, "ForTokenClassification" -> `MistralForProcessReward` with one label) with the trunk of
    the causal-LM checkpoint `policy_dir` (its lm_head is dropped) and a fresh score head: weight truncated normal
    (std = initializer_range, cut at 3 std, init_weights' rule) from a generator seeded by `seed`, so the start is
    reproducible and does not consume the global RNG; bias (if any) zero."""
    ckpt = resolve_checkpoint_dir(policy_dir)
    cfg = load_hf_config(ckpt)
    family = family_of_config(cfg)
    heads = [c for c in family.models if c.hf_architecture.endswith(head)]
    if not heads:
        raise CheckpointError(f"{ckpt}: the {family.name} family has no *{head} critic (models: "
                              f"{[m.__name__ for m in family.models]}); a reward model cannot start from it")
    with torch.device("meta"):
        model = heads[0](cfg, init=False).to(dtype)
    model = model.to_empty(device=device)
    load_weights_into(model, ckpt, ignore_missing=("score.",), ignore_unexpected=("lm_head.",))
    std = cfg.initializer_range
    with torch.no_grad():
        w = torch.empty(model.score.weight.shape, dtype=torch.float32)
        nn.init.trunc_normal_(w, std=std, a=-3 * std, b=3 * std, generator=torch.Generator().manual_seed(seed))
        model.score.weight.copy_(w)
        if model.score.bias is not None:
            model.score.bias.zero_()
    return model


@dataclass(frozen=True)
class RmHeadConfig:
    """[head] table: how the fresh score head trains next to the pretrained trunk."""

    lr_scale: float = 1.0  # the score head's peak lr = [optimizer] lr * lr_scale (its own param group)

    def __post_init__(self):
        if not self.lr_scale > 0:
            raise ValueError(f"[head] lr_scale must be > 0, got {self.lr_scale}")


def split_head_group(optimizer: torch.optim.Optimizer, head: nn.Module, lr_scale: float) -> None:
    """Move `head`'s parameters out of each optimizer group into a sibling group ("score_head" for "decay", else
    "score_head_<name>": its weight decay is kept) whose lr is scaled: a fresh head starts from noise while the trunk
    is trained, so one lr cannot suit both. Call before any step (no optimizer state yet); the group order is
    deterministic, so a resume's optimizer state lines up."""
    ids = {id(p) for p in head.parameters()}
    kept, heads = [], []
    for g in optimizer.param_groups:
        moved = [p for p in g["params"] if id(p) in ids]
        rest = [p for p in g["params"] if id(p) not in ids]
        if moved:
            name = "score_head" if g.get("name") == "decay" else f"score_head_{g.get('name')}"
            heads.append({**g, "params": moved, "name": name, "lr": g["lr"] * lr_scale,
                          "base_lr": g["base_lr"] * lr_scale})
        if rest:
            kept.append({**g, "params": rest})
    optimizer.param_groups[:] = []
    for g in kept + heads:
        optimizer.add_param_group(g)


class RmTrainModule(PairTrainModule):
    """Bradley-Terry (+ margin, + reward centering) on the stacked arms of a preference batch."""

    def __init__(self, model: nn.Module, cfg: TrainModuleConfig, loss_cfg: RmLossConfig, total_steps: int,
                 seed: int = 0, head: RmHeadConfig = RmHeadConfig()):
        self.loss_cfg = loss_cfg  # set before super().__init__: wrapping binds self.loss
        super().__init__(model, cfg, total_steps, seed)
        if head.lr_scale != 1.0:
            split_head_group(self.optimizer, model.score, head.lr_scale)
            self.banner += f"; score_head: lr x {head.lr_scale}"

    def loss(self, model: nn.Module, batch: dict) -> LossOutput | PairRewards:
        if batch.get(SCORE_ONLY):
            return pair_rewards(model, batch)
        scored = pair_rewards(model, batch)
        margin = batch.get("margin")
        out = rm_loss(scored.chosen, scored.rejected, self.loss_cfg,
                      margin=margin.to(scored.chosen.device) if margin is not None else None)
        pairs = float(scored.chosen.shape[0])
        values = (pairs, out.per_pair.detach().sum(), out.bt.sum(), (out.margins > 0).sum(), out.margins.sum(),
                  scored.chosen.detach().sum(), scored.rejected.detach().sum(),
                  batch["chosen_attention_mask"].sum() + batch["rejected_attention_mask"].sum())
        dev = scored.chosen.device
        sums = {k: torch.as_tensor(v, dtype=torch.float32, device=dev) for k, v in zip(SUM_KEYS, values, strict=True)}
        return LossOutput(loss=out.per_pair.sum(), sums=sums)

    def log_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        pairs = sums.get("pairs", 0.0)

        def mean(key: str) -> float:
            return sums[key] / pairs if pairs else float("nan")

        return {"loss": mean("objective_sum"), "bt_loss": mean("bt_sum"), "rewards/accuracy": mean("correct"),
                "rewards/margin": mean("margin_sum"), "rewards/chosen": mean("chosen_reward_sum"),
                "rewards/rejected": mean("rejected_reward_sum"), "pairs": pairs,
                "input_tokens": sums.get("input_tokens", 0.0)}


def model_scorer(model: nn.Module) -> Callable[[dict], PairRewards]:
    """A `score` for `reward_eval` from a plain (unwrapped) critic, in eval mode without gradients."""

    @torch.no_grad()
    def score(batch: dict) -> PairRewards:
        was_training = model.training
        model.eval()
        try:
            return pair_rewards(model, batch)
        finally:
            model.train(was_training)

    return score


def reward_eval(score: Callable[[dict], PairRewards], batches: Iterable[dict]) -> dict[str, float]:
    """Held-out pair metrics of the critic behind `score`: accuracy (r_c > r_r; a tie counts as wrong), mean margin,
    mean reward of each arm, and the pair count."""
    n = correct = margin = chosen_sum = rejected_sum = 0.0
    for batch in batches:
        scored = score(batch)
        chosen, rejected = scored.chosen.float().cpu(), scored.rejected.float().cpu()
        n += chosen.shape[0]
        correct += float((chosen > rejected).sum())
        margin += float((chosen - rejected).sum())
        chosen_sum += float(chosen.sum())
        rejected_sum += float(rejected.sum())

    def mean(x: float) -> float:
        return x / n if n else float("nan")

    return {"pairs": n, "accuracy": mean(correct), "margin": mean(margin), "chosen_reward": mean(chosen_sum),
            "rejected_reward": mean(rejected_sum)}
