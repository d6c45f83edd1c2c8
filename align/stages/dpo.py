"""align.stages.dpo: DPO from the SFT checkpoint against the cached reference log-probs (`dpo_checkpoint`).

    python -m align.stages.dpo --config configs/tiny/dpo.toml [table.key=value ...]

Reads `<runs>/<data.reference>` (the SFT checkpoint: the policy's initial weights, and the reference the cache was
built from), `<runs>/<data.pairs>` (preference shards) and `<runs>/<data.ref_cache>`, opened with the key this
stage computes from those artifacts: a cache of another checkpoint, shard set, tokenizer or precision is refused.
The reference model is never loaded. Every `data.heldout_every`-th pair (row % N == 0) is held out of training;
after training, the preference accuracy of the SFT checkpoint (from the cache) and of the DPO policy on those
pairs, and DPO's reward accuracy and margin there, go to `<run_dir>/metrics.json` (the receipt's metrics).
Publishes `<run_dir>/final/` (HF format). Resumes from `<run_dir>/checkpoints/` like every Trainer stage.
`<runs>` is $ALIGN_RUNS_DIR under the pipeline, else runs/tiny.

NOTE: the held-out pairs come from the same generator as the training pairs (the bundle has no held-out preference
split); a separate preference shard set would be the stricter test."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from align.config import load_cli_config, run_dir_from_env, write_resolved_config
from align.data.loader import BatchLoader, LoaderConfig
from align.data.store import ShardSet
from align.exit_codes import exit_stage
from align.model.checkpoint import DTYPES, load_checkpoint, tokenizer_dir_for
from align.lora.adapters import LoraConfig
from align.lora.checkpoint import lora_weight_format
from align.lora.stage import inloop_eval, maybe_lora, publish_final
from align.profile import CommonConfig
from align.tokenizer import Tokenizer, TokenizerConfig
from align.eval.inloop_config import InLoopEvalConfig
from align.train.callbacks import ProgressLine, SpeedMonitor
from align.train.dpo_loss import DpoLossConfig
from align.train.dpo_module import DpoTrainModule, preference_eval
from align.train.identity import run_identity
from align.train.moe_module import MoeAuxConfig, build_train_module, moe_callbacks
from align.train.optim import OptimizerConfig
from align.train.parallel import ParallelConfig
from align.train.probes import ProbeConfig, Tripwires
from align.train.ref_cache import RefCache, cache_key, cached_preference_accuracy
from align.train.schedulers import SchedulerConfig
from align.train.train_module import TrainModuleConfig
from align.train.trainer import Trainer, TrainerConfig
from align.utils.dist import device, init_distributed, is_rank0
from align.utils.fsio import atomic_write_json
from align.stages.pair_data import (ModelDtypeConfig, PairDataConfig, RowSubset, heldout_batches, split_rows,
                                     train_summary)
from align.stages.ref_cache import tokenizer_hash


@dataclass(frozen=True)
class DpoDataConfig(PairDataConfig):
    """[data] table: the shared pair keys (align.stages.pair_data) and the reference and its cache, under <runs>."""

    reference: str = "sft_checkpoint/final"
    ref_cache: str = "ref_cache/preference"
    ref_dtype: Literal["float32", "bfloat16"] = "float32"  # precision the cache must have been computed in


@dataclass(frozen=True, kw_only=True)
class DpoStageConfig(CommonConfig):
    train: TrainerConfig  # [train]: max_steps is required
    model: ModelDtypeConfig = field(default_factory=ModelDtypeConfig)
    data: DpoDataConfig = field(default_factory=DpoDataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    loader: LoaderConfig = field(default_factory=LoaderConfig)
    loss: DpoLossConfig = field(default_factory=DpoLossConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    probes: ProbeConfig = field(default_factory=lambda: ProbeConfig(armed=("grad_norm", "loss_spike")))
    inloop_eval: InLoopEvalConfig = field(default_factory=InLoopEvalConfig)
    moe_aux: MoeAuxConfig = field(default_factory=MoeAuxConfig)  # [moe_aux]: MoE policies only (default: none)
    lora: LoraConfig | None = None  # [lora]: train adapters only, publish the merged model (align.lora.stage)


SUMMARY_KEYS = ("loss", "rewards/accuracy", "rewards/margin", "rewards/chosen", "rewards/rejected")


def heldout_metrics(module: DpoTrainModule, shards: ShardSet, cache: RefCache, rows: np.ndarray,
                    cfg: DpoStageConfig) -> dict:
    """Preference accuracy of the SFT checkpoint (its cached log-probs) and of the trained policy on `rows`."""
    if not len(rows):
        return {}
    batches = heldout_batches(shards, rows, cfg.data.eval_batch_pairs)
    dpo = preference_eval(module.score, batches, cfg.loss.beta, ref_cache=cache)
    sft_acc = cached_preference_accuracy(cache, torch.from_numpy(rows))
    return {"heldout_pairs": len(rows), "sft_preference_accuracy": sft_acc,
            "dpo_preference_accuracy": dpo["preference_accuracy"], "dpo_reward_accuracy": dpo["reward_accuracy"],
            "dpo_reward_margin": dpo["reward_margin"], "sft_preference_accuracy_all_pairs":
            cached_preference_accuracy(cache)}


def main() -> int:
    cfg = load_cli_config(DpoStageConfig, prog="align.stages.dpo")
    runs = Path(os.environ.get("ALIGN_RUNS_DIR", "runs/tiny"))
    run_dir = run_dir_from_env(runs / "dpo_checkpoint")
    init_distributed(run_dir=run_dir)
    torch.set_num_threads(cfg.data.threads or os.cpu_count() or 1)
    if is_rank0():
        write_resolved_config(cfg, run_dir)
    reference, tok_hash = runs / cfg.data.reference, tokenizer_hash(cfg.tokenizer)
    shards = ShardSet.open(runs / cfg.data.pairs, kind="pairs", tokenizer_hash=tok_hash)
    cache = RefCache.open(runs / cfg.data.ref_cache, cache_key(reference, shards.digest, tok_hash, cfg.data.ref_dtype),
                          len(shards))
    train_rows, held_rows = split_rows(len(shards), cfg.data.heldout_every)
    model = maybe_lora(load_checkpoint(reference, dtype=DTYPES[cfg.model.dtype], device=device()), cfg.lora, "dpo",
                       seed=cfg.run.seed)
    module_cfg = TrainModuleConfig(optimizer=cfg.optimizer, scheduler=cfg.scheduler, parallel=cfg.parallel)
    module = build_train_module(DpoTrainModule, model, module_cfg, cfg.loss, cache, cfg.train.max_steps,
                                seed=cfg.run.seed, cache_rows=torch.from_numpy(train_rows), moe_aux=cfg.moe_aux,
                                stage="dpo")
    loader = BatchLoader(RowSubset(shards, train_rows), cfg.loader, seed=cfg.run.seed)
    n_params = sum(p.numel() for p in model.parameters())
    tripwires = Tripwires(cfg.probes, list(module.model.parameters()), model.config.vocab_size)
    callbacks = [SpeedMonitor(n_params), tripwires, ProgressLine(cfg.train.max_steps, label="dpo")]
    tok = Tokenizer.from_pretrained(tokenizer_dir_for(reference) or cfg.tokenizer.path, cfg.tokenizer.cache)
    inloop = inloop_eval(cfg.inloop_eval, runs, tok, module, cfg.train.max_steps, cfg.lora, engine_model=model)
    callbacks += [inloop] if inloop is not None else []
    callbacks += moe_callbacks(cfg.moe_aux)
    inputs = {"reference": cache.key.reference, "pairs": shards.digest, "ref_cache": cache.key.digest()}
    trainer = Trainer(cfg.train, module, loader, run_dir, callbacks, identity=run_identity(cfg, inputs),
                      weight_format=lora_weight_format(cfg.lora, module.model, reference, run_dir))
    code = trainer.fit()
    if code != 0:
        return code
    metrics = heldout_metrics(module, shards, cache, held_rows, cfg)
    if is_rank0():
        atomic_write_json(run_dir / "metrics.json", {**metrics, **train_summary(run_dir, SUMMARY_KEYS),
                                                     "train_pairs": len(train_rows), "cache_key": cache.key.digest()})
        print("dpo: held-out preference accuracy "
              f"SFT {metrics.get('sft_preference_accuracy', float('nan')):.3f} -> "
              f"DPO {metrics.get('dpo_preference_accuracy', float('nan')):.3f}")
    publish_final(trainer, cfg.lora, run_dir / "final", tokenizer_dir=tokenizer_dir_for(reference),
                  inputs=inputs)  # collective
    return 0


if __name__ == "__main__":
    exit_stage(main)
