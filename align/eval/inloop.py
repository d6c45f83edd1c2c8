"""In-loop held-out evaluation for every training stage: a user sees learning while it happens.

Every `every` optimizer steps (and at the last step) the callback measures, on a small fixed held-out set:
- `eval/accuracy`: greedy verifier-judged accuracy of the live weights (align.eval.canary.evaluate through an Engine),
- `eval/nll`: the teacher-forced mean NLL per token of the same problems' gold worked solutions (an SFT-kind shard
  set built from the held-out split), i.e. how likely the policy still finds the demonstrations,
as history columns, NaN on the other steps (every history row keeps one column set). `pipeline/report.py` draws
them per stage. The stage's receipt keeps its own full-size before/after evaluation; this one is small so that it
costs a few percent of the stage (64 rows x 3-6 points by default).

The Engine samples from its own copy of the weights: a stage whose sampler already follows the policy (GRPO) passes
it with `sync=None`; SFT and DPO pass a client on a copy and `sync` pushes the training weights into it first
(collective under FSDP2, like every other full-weight gather: every rank calls `observe`)."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn

from align.data.collate import collate
from align.data.store import ShardSet
from align.eval.inloop_config import InLoopEvalConfig
from align.eval.verifier import score
from align.eval.prompts import PromptSet
from align.eval.canary import EvalTask, evaluate
from align.rollout.native import NativeRolloutClient
from align.train.callbacks import Callback
from align.train.sft_loss import SftLossConfig, sft_loss
from align.utils.dist import all_reduce_sum, rank, world_size

COLUMNS = ("eval/accuracy", "eval/nll")


def verifier_task(prompts: ShardSet, decode: Callable[[list[int]], str], eos_id: int) -> EvalTask:
    """Held-out prompts judged by the GRPO reward's verifier (a right box, the format rule included)."""
    held = PromptSet.from_shards(prompts)
    return EvalTask(held.ids, held.gold, decode, lambda text, gold: score(text, gold).reward == 1.0, eos_id,
                    group=lambda r: held.groups[int(r)])


@torch.no_grad()
def heldout_nll(model: nn.Module, solutions: ShardSet, rows: range, batch_rows: int) -> float:
    """Mean NLL per label token of `rows` of an SFT-kind shard set (rows split over ranks, sums all-reduced)."""
    mine = list(rows)[rank()::world_size()]
    dev = next(model.parameters()).device
    was_training = model.training
    model.eval()
    ce, tokens = 0.0, 0.0
    try:
        for start in range(0, len(mine), batch_rows):
            batch = collate(solutions, np.asarray(mine[start:start + batch_rows]))
            batch = {k: v.to(dev) if torch.is_tensor(v) else v for k, v in batch.items()}
            out = sft_loss(model, batch, SftLossConfig())
            ce += float(out.sums["ce_sum"])
            tokens += float(out.sums["tokens"])
    finally:
        model.train(was_training)
    ce, tokens = all_reduce_sum([ce, tokens]).tolist()
    return ce / tokens if tokens else math.nan


def engine_copy(model: nn.Module) -> nn.Module:
    """A float32 copy of a plain (unsharded) model for an in-loop Engine; the sync refreshes its weights.
    NOTE: FSDP2 shards parameters in place, and the held-out NLL calls the model outside the wrapped root, so a
    sharded model is refused here rather than evaluated wrongly (DDP and one process are fine)."""
    if any(hasattr(p, "full_tensor") for p in model.parameters()):
        raise ValueError("inloop_eval: the model's parameters are FSDP2-sharded (DTensor); in-loop evaluation runs "
                         "with one process or DDP ([parallel] strategy), or set [inloop_eval] every = 0")
    return copy.deepcopy(model).float().eval().requires_grad_(False)


class InLoopEval(Callback):
    name = "inloop_eval"

    def __init__(self, cfg: InLoopEvalConfig, total_steps: int, client, task: EvalTask, num_prompts: int,
                 model: Callable[[], nn.Module], solutions: ShardSet | None = None,
                 sync: Callable[[], None] | None = None):
        self.cfg, self.total_steps, self.client, self.task = cfg, total_steps, client, task
        self.model, self.solutions, self.sync = model, solutions, sync
        self.rows = range(min(cfg.rows, num_prompts))
        self.nll_rows = range(min(cfg.rows, len(solutions))) if solutions is not None else range(0)
        self.last: dict[str, float] = {}

    def due(self, step: int) -> bool:
        return bool(self.cfg.every) and (step % self.cfg.every == 0 or step == self.total_steps)

    def observe(self, trainer, metrics: dict) -> str | None:
        for key in COLUMNS:
            metrics[key] = math.nan
        if not self.due(trainer.step):
            return None
        self.last = self.measure()
        metrics.update(self.last)
        return None

    def measure(self) -> dict[str, float]:
        if self.sync is not None:
            self.sync()
        result = evaluate(self.client, self.task, self.rows, self.cfg.max_new_tokens)
        nll = (heldout_nll(self.model(), self.solutions, self.nll_rows, self.cfg.nll_batch_rows)
               if self.solutions is not None else math.nan)
        return {"eval/accuracy": result["pass@1"], "eval/nll": nll}


def build_inloop_eval(cfg: InLoopEvalConfig, runs: Path, tok, module, total_steps: int, *, client=None,
                      engine_model: nn.Module | None = None) -> InLoopEval | None:
    """The stage's callback, or None when `every` is 0. `client`: a sampler that already follows the policy (GRPO);
    else `engine_model` (the plain, unwrapped model) is copied into an Engine refreshed from `module` before each
    evaluation."""
    if not cfg.every:
        return None
    prompts = ShardSet.open(runs / cfg.prompts, kind="prompts", tokenizer_hash=tok.content_hash)
    solutions = (ShardSet.open(runs / cfg.solutions, kind="sft", tokenizer_hash=tok.content_hash)
                 if cfg.solutions else None)
    task = verifier_task(prompts, lambda ids: tok.decode(ids, skip_special_tokens=True), tok.eos_id)
    sync = None
    if client is None:
        if engine_model is None:
            raise ValueError("build_inloop_eval: give the sampler (client) or the model to copy (engine_model)")
        client = NativeRolloutClient(engine_copy(engine_model), vocab_limit=tok.vocab_size)
        sync = lambda: client.update_weights(full_weights(module.model))  # noqa: E731
    return InLoopEval(cfg, total_steps, client, task, len(prompts), lambda: module.model, solutions, sync)


def full_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor of the state dict, unsharded on every rank (each rank's Engine needs all of them)."""
    return {name: (t.full_tensor() if hasattr(t, "full_tensor") else t).detach()
            for name, t in model.state_dict().items()}
