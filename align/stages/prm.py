"""align.stages.prm: a process reward model from the SFT checkpoint on rule-labelled solution steps of the bundled
task (`prm_checkpoint`), what PPO's `[reward] process_model` scores each step with (align.rl.ppo.process_rewards).

    python -m align.stages.prm --config configs/tiny/prm.toml [table.key=value ...]

Reads `<runs>/<data.init>` (the SFT checkpoint: the PRM's trunk, a fresh per-token score head,
align.reward.rm_module.critic_from_policy with head "ForTokenClassification") and `<runs>/<data.records>` (preference
pair records, records.parquet: the on-policy pairs' chosen and rejected solutions, the policy's own samples beside
scripted ones). Every line of both solutions is a step labelled by rule (align.reward.step_labels: a false `a op b = c`
or a box off the gold is wrong, true arithmetic or the gold's box right, anything else neutral:
[loss] neutral decides), encoded as align.reward.rm_process trains a PRM (the label on each step's last token). A
solution whose steps do not end on token boundaries is skipped and counted. Pairs with index % heldout_every == 0
are held out (both solutions; the DPO stage's split of the same pairs); the held-out step accuracy, the accuracy on
wrong steps alone and the share of right steps (the always-right baseline) before and after training go to
`<run_dir>/metrics.json`. `[head] lr_scale`: the fresh score head's lr multiple (its own param group, the reward
model's rule, align.reward.rm_module.split_head_group). Publishes `<run_dir>/final/` (HF
MistralForTokenClassification, num_labels 1). Resumes from `<run_dir>/checkpoints/` like every Trainer stage. One process (the stream is in memory)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from align.config import load_cli_config, run_dir_from_env, write_resolved_config
from align.data.ingest_parquet import iter_records
from align.exceptions import DataError
from align.exit_codes import exit_stage
from align.model.checkpoint import DTYPES, checkpoint_content_hash, tokenizer_dir_for
from align.reward.step_batches import StepBatches
from align.reward.step_labels import step_records
from align.profile import CommonConfig
from align.stages.pair_data import ModelDtypeConfig
from align.tokenizer import Tokenizer, TokenizerConfig
from align.train.callbacks import ProgressLine, SpeedMonitor
from align.train.identity import run_identity
from align.train.optim import OptimizerConfig
from align.reward.rm_module import RmHeadConfig, critic_from_policy, split_head_group
from align.reward.rm_process import PrmLossConfig, PrmTrainModule, collate_steps, encode_steps, prm_eval
from align.train.schedulers import SchedulerConfig
from align.train.train_module import TrainModuleConfig
from align.train.trainer import Trainer, TrainerConfig
from align.utils.dist import device, init_distributed, is_rank0, world_size
from align.utils.fsio import atomic_write_json
from align.utils.manifest import read_manifest
from align.utils.tracking import read_history


@dataclass(frozen=True)
class PrmDataConfig:
    """[data] table: inputs relative to <runs>, the held-out split, the batch shape."""

    init: str = "sft_checkpoint/final"
    records: str = "onpolicy_pairs/out"  # a directory with records.parquet of preference pairs
    heldout_every: int = 10  # pairs with index % N == 0 are held out (both solutions)
    micro_batch_size: int = 32  # solutions per forward
    grad_accum: int = 1
    eval_batch_rows: int = 64
    threads: int = 0  # torch CPU threads; 0: every core

    def __post_init__(self):
        if self.heldout_every < 2:
            raise ValueError(f"heldout_every must be >= 2 (the receipt needs held-out steps), got {self.heldout_every}")


@dataclass(frozen=True, kw_only=True)
class PrmStageConfig(CommonConfig):
    train: TrainerConfig
    model: ModelDtypeConfig = field(default_factory=ModelDtypeConfig)  # [model] dtype, as the reward model's
    data: PrmDataConfig = field(default_factory=PrmDataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    loss: PrmLossConfig = field(default_factory=PrmLossConfig)
    head: RmHeadConfig = field(default_factory=RmHeadConfig)  # [head] lr_scale: the fresh score head's lr multiple
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)


def encoded_split(tok, records_dir: Path, cfg: PrmStageConfig) -> tuple[list, list, int]:
    """(train rows, held-out rows, skipped solutions) of the pairs' rule-labelled solutions."""
    pairs = list(iter_records(records_dir / "records.parquet", "pairs"))
    train, held, skipped = [], [], 0
    for i, pair in enumerate(pairs):
        for record in step_records([pair]):
            try:
                row = encode_steps(tok, record, cfg.loss)
            except DataError:
                skipped += 1
                continue
            if row.labels:
                (held if i % cfg.data.heldout_every == 0 else train).append(row)
    return train, held, skipped


def heldout_steps(model, rows: list, batch_rows: int) -> dict:
    out = prm_eval(model, (collate_steps(rows[k:k + batch_rows]) for k in range(0, len(rows), batch_rows)))
    labels = [label for r in rows for label in r.labels]
    return {**out, "positive_share": sum(labels) / len(labels) if labels else float("nan")}


def main() -> int:
    cfg = load_cli_config(PrmStageConfig, prog="align.stages.prm")
    runs = Path(os.environ.get("ALIGN_RUNS_DIR", "runs/tiny"))
    run_dir = run_dir_from_env(runs / "prm_checkpoint")
    init_distributed(run_dir=run_dir)
    if world_size() > 1:
        raise ValueError("align.stages.prm runs on one process (its step stream is in memory)")
    torch.set_num_threads(cfg.data.threads or os.cpu_count() or 1)
    if is_rank0():
        write_resolved_config(cfg, run_dir)
    init, records = runs / cfg.data.init, runs / cfg.data.records
    tok = Tokenizer.from_pretrained(tokenizer_dir_for(init) or cfg.tokenizer.path, cfg.tokenizer.cache)
    train_rows, held_rows, skipped = encoded_split(tok, records, cfg)
    prm = critic_from_policy(init, dtype=DTYPES[cfg.model.dtype], device=device(), seed=cfg.run.seed,
                             head="ForTokenClassification")
    module = PrmTrainModule(prm, TrainModuleConfig(optimizer=cfg.optimizer, scheduler=cfg.scheduler), cfg.loss,
                            cfg.train.max_steps, seed=cfg.run.seed)
    if cfg.head.lr_scale != 1.0:  # the reward model's rule: a fresh head next to a trained trunk (before any step)
        split_head_group(module.optimizer, module.model.score, cfg.head.lr_scale)
    loader = StepBatches(train_rows, cfg.data.micro_batch_size, cfg.data.grad_accum, cfg.run.seed,
                         pad_id=prm.config.pad_token_id or 0)
    print(f"prm: {len(train_rows)} train / {len(held_rows)} held-out solutions "
          f"({sum(len(r.labels) for r in train_rows)} / {sum(len(r.labels) for r in held_rows)} labelled steps), "
          f"{skipped} skipped (steps not on token boundaries)", flush=True)
    callbacks = [SpeedMonitor(sum(p.numel() for p in prm.parameters())),
                 ProgressLine(cfg.train.max_steps, label="prm")]
    inputs = {"init": checkpoint_content_hash(init),
              "records": read_manifest(records)["files"]["records.parquet"]["sha256"]}
    trainer = Trainer(cfg.train, module, loader, run_dir, callbacks, identity=run_identity(cfg, inputs))
    before = heldout_steps(module.model, held_rows, cfg.data.eval_batch_rows)  # the fresh head
    code = trainer.fit()
    if code != 0:
        return code
    after = heldout_steps(module.model, held_rows, cfg.data.eval_batch_rows)
    last = (read_history(run_dir / "history.jsonl") or [{}])[-1]
    metrics = {"heldout_steps": int(after["steps"]), "heldout_positive_share": after["positive_share"],
               "heldout_accuracy_before": before["accuracy"], "heldout_accuracy": after["accuracy"],
               "heldout_negative_accuracy_before": before["negative_accuracy"],
               "heldout_negative_accuracy": after["negative_accuracy"], "heldout_loss": after["loss"],
               "train_solutions": len(train_rows), "skipped_solutions": skipped, "steps": last.get("step", 0),
               "train_loss": last.get("loss"), "train_step_accuracy": last.get("steps/accuracy")}
    atomic_write_json(run_dir / "metrics.json", metrics)
    print(f"prm: held-out step accuracy {before['accuracy']:.3f} -> {after['accuracy']:.3f} (right-step share "
          f"{after['positive_share']:.3f}); wrong steps caught {before['negative_accuracy']:.3f} -> "
          f"{after['negative_accuracy']:.3f} ({metrics['heldout_steps']} steps)", flush=True)
    trainer.publish_final(run_dir / "final", tokenizer_dir=tokenizer_dir_for(init), inputs=inputs)
    return 0


if __name__ == "__main__":
    exit_stage(main)
