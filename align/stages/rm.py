"""align.stages.rm: a Bradley-Terry reward model from the SFT checkpoint on the preference pairs (`rm_checkpoint`).

    python -m align.stages.rm --config configs/tiny/rm.toml [table.key=value ...]

Reads `<runs>/<data.init>` (the SFT checkpoint: the critic's trunk; its lm_head is dropped and the score head starts
fresh, align.reward.rm_module.critic_from_policy) and `<runs>/<data.pairs>` (preference shards: DPO's, or the
reward model's own, `rm_shards/out` on tiny). Every `data.heldout_every`-th pair (row % N == 0, the DPO stage's
split) is held out; the critic's held-out pair accuracy (r_c > r_r) and mean margin before training (the fresh head)
and after go to `<run_dir>/metrics.json` (the receipt). With `data.compare_pairs` (another pair shard set, e.g.
DPO's) its held-out rows (the same split) are scored too, as `compare_*`: on DPO's shards, the same pairs as
dpo_checkpoint's `sft_preference_accuracy`. Publishes `<run_dir>/final/`: an ordinary HF checkpoint
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

import numpy as np
import torch

from align.config import load_cli_config, run_dir_from_env, write_resolved_config
from align.data.loader import BatchLoader, LoaderConfig
from align.data.store import ShardSet
from align.exit_codes import exit_stage
from align.model.checkpoint import DTYPES, checkpoint_content_hash, tokenizer_dir_for
from align.profile import CommonConfig
from align.stages.pair_data import (ModelDtypeConfig, PairDataConfig, RowSubset, heldout_batches, split_rows,
                                     train_summary)
from align.stages.ref_cache import tokenizer_hash
from align.tokenizer import TokenizerConfig
from align.train.callbacks import ProgressLine, SpeedMonitor
from align.train.identity import run_identity
from align.train.optim import OptimizerConfig
from align.train.parallel import ParallelConfig
from align.train.probes import ProbeConfig, Tripwires
from align.reward.rm_loss import RmLossConfig
from align.reward.rm_module import RmHeadConfig, RmTrainModule, critic_from_policy, reward_eval
from align.train.schedulers import SchedulerConfig
from align.train.train_module import TrainModuleConfig
from align.train.trainer import Trainer, TrainerConfig
from align.utils.dist import device, init_distributed, is_rank0
from align.utils.fsio import atomic_write_json


@dataclass(frozen=True)
class RmDataConfig(PairDataConfig):
    """[data] table: the shared pair keys (align.stages.pair_data), the critic's start and a second pair set whose
    held-out split is scored too; paths under <runs>."""

    init: str = "sft_checkpoint/final"  # the causal-LM checkpoint whose trunk the critic starts from
    # Optional: another preference shard set (e.g. the DPO rung's `shards/preference/out`) whose rows with
    # row % heldout_every == 0 are scored as well (`compare_*` in the receipt), so a critic trained on its own
    # pairs still reads beside dpo_checkpoint's `sft_preference_accuracy` on the same pairs. "": none.
    compare_pairs: str = ""


@dataclass(frozen=True, kw_only=True)
class RmStageConfig(CommonConfig):
    train: TrainerConfig  # [train]: max_steps is required
    model: ModelDtypeConfig = field(default_factory=ModelDtypeConfig)
    data: RmDataConfig = field(default_factory=RmDataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)  # the shards' tokenizer (identity check)
    loader: LoaderConfig = field(default_factory=LoaderConfig)
    loss: RmLossConfig = field(default_factory=RmLossConfig)
    head: RmHeadConfig = field(default_factory=RmHeadConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    probes: ProbeConfig = field(default_factory=lambda: ProbeConfig(armed=("grad_norm", "loss_spike")))


SUMMARY_KEYS = ("loss", "bt_loss", "rewards/accuracy", "rewards/margin", "rewards/chosen", "rewards/rejected")


def heldout_rewards(module: RmTrainModule, shards: ShardSet, rows: np.ndarray, cfg: RmStageConfig) -> dict:
    """reward_eval of the module's critic on the pairs `rows` (every rank scores every batch: FSDP collective)."""
    if not len(rows):
        return {}
    return reward_eval(module.score, heldout_batches(shards, rows, cfg.data.eval_batch_pairs))


def receipt(before: dict, after: dict, prefix: str = "") -> dict:
    """The held-out metrics before (the fresh head) and after training, keys prefixed by `prefix`."""
    if not before:
        return {f"{prefix}heldout_pairs": 0}
    out = {"heldout_pairs": int(after["pairs"]), "heldout_accuracy_before": before["accuracy"],
           "heldout_accuracy": after["accuracy"], "heldout_margin_before": before["margin"],
           "heldout_margin": after["margin"], "heldout_chosen_reward": after["chosen_reward"],
           "heldout_rejected_reward": after["rejected_reward"]}
    return {f"{prefix}{k}": v for k, v in out.items()}


def compare_set(runs: Path, cfg: RmStageConfig) -> tuple[ShardSet, np.ndarray] | None:
    """`data.compare_pairs` and its held-out rows (the same `heldout_every` split), or None when unset."""
    if not cfg.data.compare_pairs:
        return None
    shards = ShardSet.open(runs / cfg.data.compare_pairs, kind="pairs", tokenizer_hash=tokenizer_hash(cfg.tokenizer))
    return shards, split_rows(len(shards), cfg.data.heldout_every)[1]


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
    compare = compare_set(runs, cfg)
    before = heldout_rewards(module, shards, held_rows, cfg)  # the fresh head: fit() has not resumed anything yet
    compare_before = heldout_rewards(module, *compare, cfg) if compare else {}
    code = trainer.fit()
    if code != 0:
        return code
    after = heldout_rewards(module, shards, held_rows, cfg)
    compare_after = heldout_rewards(module, *compare, cfg) if compare else {}
    if is_rank0():
        metrics = {**receipt(before, after), **train_summary(run_dir, SUMMARY_KEYS), "train_pairs": len(train_rows)}
        if compare:
            metrics.update(receipt(compare_before, compare_after, prefix="compare_"))
        atomic_write_json(run_dir / "metrics.json", metrics)
        print(f"rm: held-out pair accuracy {metrics.get('heldout_accuracy_before', float('nan')):.3f} -> "
              f"{metrics.get('heldout_accuracy', float('nan')):.3f} ({metrics['heldout_pairs']} pairs)"
              + (f"; on {cfg.data.compare_pairs}'s {metrics['compare_heldout_pairs']} held-out pairs "
                 f"{metrics.get('compare_heldout_accuracy_before', float('nan')):.3f} -> "
                 f"{metrics.get('compare_heldout_accuracy', float('nan')):.3f}" if compare else ""))
    trainer.publish_final(run_dir / "final", tokenizer_dir=tokenizer_dir_for(init), inputs=inputs)  # collective
    return 0


if __name__ == "__main__":
    exit_stage(main)
