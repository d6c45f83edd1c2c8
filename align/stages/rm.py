"""align.stages.rm: a Bradley-Terry reward model from the SFT checkpoint on the preference pairs (`rm_checkpoint`).

    python -m align.stages.rm --config configs/tiny/rm.toml [table.key=value ...]

Reads `<runs>/<data.init>` (the SFT checkpoint: the critic's trunk; its lm_head is dropped and the score head starts
fresh, align.train.rm_module.critic_from_policy) and `<runs>/<data.pairs>` (the preference shards DPO trains on).
Every `data.heldout_every`-th pair (row % N == 0, the DPO stage's split, so the two receipts score the same pairs)
is held out; the critic's held-out pair accuracy (r_c > r_r) and mean margin before training (the fresh head) and
after go to `<run_dir>/metrics.json` (the receipt). Publishes `<run_dir>/final/`: an ordinary HF checkpoint
(config.json architecture MistralForSequenceClassification, num_labels 1) that transformers loads. Resumes from
`<run_dir>/checkpoints/` like every Trainer stage. `<runs>` is $ALIGN_RUNS_DIR under the pipeline, else runs/tiny.

transformers picks each row's last token from `input_ids != pad_token_id`, align from the attention mask: equal on
right-padded rows whose content never holds the pad id (the stage warns when the checkpoint has no pad_token_id,
since transformers then refuses batches of more than one row).

NOTE: the held-out pairs come from the same generator as the training pairs (as for DPO)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from align.config import load_cli_config, run_dir_from_env, write_resolved_config
from align.data.collate import collate
from align.data.loader import BatchLoader, LoaderConfig
from align.data.store import ShardSet
from align.exit_codes import exit_stage
from align.model.checkpoint import DTYPES, checkpoint_content_hash, tokenizer_dir_for
from align.profile import CommonConfig
from align.stages.dpo import RowSubset, split_rows
from align.stages.ref_cache import tokenizer_hash
from align.tokenizer import TokenizerConfig
from align.train.callbacks import ProgressLine, SpeedMonitor
from align.train.identity import run_identity
from align.train.optim import OptimizerConfig
from align.train.parallel import ParallelConfig
from align.train.probes import ProbeConfig, Tripwires
from align.train.ref_cache import length_sorted_rows
from align.train.rm_loss import RmLossConfig
from align.train.rm_module import RmHeadConfig, RmTrainModule, critic_from_policy, reward_eval
from align.train.schedulers import SchedulerConfig
from align.train.train_module import TrainModuleConfig
from align.train.trainer import Trainer, TrainerConfig
from align.utils.dist import device, init_distributed, is_rank0
from align.utils.fsio import atomic_write_json
from align.utils.tracking import read_history


@dataclass(frozen=True)
class RmDataConfig:
    """[data] table: where the inputs are, relative to <runs>, and which pairs are held out."""

    init: str = "sft_checkpoint/final"  # the causal-LM checkpoint whose trunk the critic starts from
    pairs: str = "shards/preference/out"
    heldout_every: int = 10  # rows with row % N == 0 are held out for evaluation; 0: none (no held-out metrics)
    eval_batch_pairs: int = 32
    threads: int = 0  # torch CPU threads; 0: every core

    def __post_init__(self):
        if self.heldout_every < 0 or self.heldout_every == 1:
            raise ValueError(f"heldout_every must be 0 or >= 2, got {self.heldout_every}")
        if self.eval_batch_pairs < 1:
            raise ValueError(f"eval_batch_pairs must be >= 1, got {self.eval_batch_pairs}")


@dataclass(frozen=True)
class RmModelConfig:
    """[model] table: the dtype the critic's parameters are held in."""

    dtype: Literal["float32", "bfloat16"] = "float32"


@dataclass(frozen=True, kw_only=True)
class RmStageConfig(CommonConfig):
    train: TrainerConfig  # [train]: max_steps is required
    model: RmModelConfig = field(default_factory=RmModelConfig)
    data: RmDataConfig = field(default_factory=RmDataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)  # the shards' tokenizer (identity check)
    loader: LoaderConfig = field(default_factory=LoaderConfig)
    loss: RmLossConfig = field(default_factory=RmLossConfig)
    head: RmHeadConfig = field(default_factory=RmHeadConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    probes: ProbeConfig = field(default_factory=lambda: ProbeConfig(armed=("grad_norm", "loss_spike")))


def heldout_rewards(module: RmTrainModule, shards: ShardSet, rows: np.ndarray, cfg: RmStageConfig) -> dict:
    """reward_eval of the module's critic on the pairs `rows` (every rank scores every batch: FSDP collective)."""
    if not len(rows):
        return {}
    plan = length_sorted_rows(shards.row_lengths[rows], cfg.data.eval_batch_pairs)
    return reward_eval(module.score, (collate(shards, rows[p]) for p in plan))


def train_summary(run_dir: Path) -> dict:
    """The last logged window's loss and reward statistics (training batches), for the receipt."""
    rows = read_history(run_dir / "history.jsonl")
    last = rows[-1] if rows else {}
    keys = ("loss", "bt_loss", "rewards/accuracy", "rewards/margin", "rewards/chosen", "rewards/rejected")
    return {"steps": last.get("step", 0), **{f"train_{k.replace('/', '_')}": last.get(k) for k in keys}}


def receipt(before: dict, after: dict) -> dict:
    if not before:
        return {"heldout_pairs": 0}
    return {"heldout_pairs": int(after["pairs"]), "heldout_accuracy_before": before["accuracy"],
            "heldout_accuracy": after["accuracy"], "heldout_margin_before": before["margin"],
            "heldout_margin": after["margin"], "heldout_chosen_reward": after["chosen_reward"],
            "heldout_rejected_reward": after["rejected_reward"]}


def main() -> int:
    cfg = load_cli_config(RmStageConfig, prog="align.stages.rm")
    runs = Path(os.environ.get("ALIGN_RUNS_DIR", "runs/tiny"))
    run_dir = run_dir_from_env(runs / "rm_checkpoint")
    init_distributed(run_dir=run_dir)
    torch.set_num_threads(cfg.data.threads or os.cpu_count() or 1)
    if is_rank0():
        write_resolved_config(cfg, run_dir)
    init = runs / cfg.data.init
    shards = ShardSet.open(runs / cfg.data.pairs, kind="pairs", tokenizer_hash=tokenizer_hash(cfg.tokenizer))
    train_rows, held_rows = split_rows(len(shards), cfg.data.heldout_every)
    critic = critic_from_policy(init, dtype=DTYPES[cfg.model.dtype], device=device(), seed=cfg.run.seed)
    if critic.config.pad_token_id is None and is_rank0():
        print(f"rm: WARNING {init} has no pad_token_id: transformers' SequenceClassification refuses batches > 1")
    module_cfg = TrainModuleConfig(optimizer=cfg.optimizer, scheduler=cfg.scheduler, parallel=cfg.parallel)
    module = RmTrainModule(critic, module_cfg, cfg.loss, cfg.train.max_steps, seed=cfg.run.seed, head=cfg.head)
    loader = BatchLoader(RowSubset(shards, train_rows), cfg.loader, seed=cfg.run.seed)
    n_params = sum(p.numel() for p in critic.parameters())
    tripwires = Tripwires(cfg.probes, list(module.model.parameters()), critic.config.vocab_size)
    callbacks = [SpeedMonitor(n_params), tripwires, ProgressLine(cfg.train.max_steps, label="rm")]
    inputs = {"init": checkpoint_content_hash(init), "pairs": shards.digest}
    trainer = Trainer(cfg.train, module, loader, run_dir, callbacks, identity=run_identity(cfg, inputs))
    before = heldout_rewards(module, shards, held_rows, cfg)  # the fresh head: fit() has not resumed anything yet
    code = trainer.fit()
    if code != 0:
        return code
    after = heldout_rewards(module, shards, held_rows, cfg)
    if is_rank0():
        metrics = {**receipt(before, after), **train_summary(run_dir), "train_pairs": len(train_rows)}
        atomic_write_json(run_dir / "metrics.json", metrics)
        print(f"rm: held-out pair accuracy {metrics.get('heldout_accuracy_before', float('nan')):.3f} -> "
              f"{metrics.get('heldout_accuracy', float('nan')):.3f} ({metrics['heldout_pairs']} pairs)")
    trainer.publish_final(run_dir / "final", tokenizer_dir=tokenizer_dir_for(init), inputs=inputs)  # collective
    return 0


if __name__ == "__main__":
    exit_stage(main)
