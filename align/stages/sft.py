"""align.stages.sft: supervised fine-tuning on the SFT shards (`sft_checkpoint`).

    python -m align.stages.sft --config configs/tiny/sft.toml [table.key=value ...]
    torchrun --nproc-per-node N -m align.stages.sft --config ...     (FSDP2 by default with several ranks)

The model is `[model].base` (an HF-format checkpoint directory) or, when that is empty, a fresh Mistral of shape
`[model.init]` seeded by `[run].seed` (the tiny profile trains from scratch). Writes into the run directory
($ALIGN_RUN_DIR, else runs/tiny/sft_checkpoint): `resolved_config.toml`, `history.jsonl`, `checkpoints/step_<N>/`,
`metrics.json` (first/last loss, tokens/s: the receipt's metrics) and, after a complete run, `final/` (HF format
with the tokenizer files, manifest last). Resumes from its own newest complete checkpoint. Exit codes: 0 published,
80 tripwire, 81 skip cap, 82 wall budget, 128+N stopped by signal N (a checkpoint was written), 2 bad input."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from align.config import config_digest, load_cli_config, run_dir_from_env, write_resolved_config
from align.data.loader import BatchLoader, LoaderConfig
from align.data.store import ShardSet
from align.eval.inloop_config import InLoopEvalConfig
from align.exit_codes import exit_stage
from align.model import MistralConfig, MistralForCausalLM
from align.model.checkpoint import DTYPES, checkpoint_content_hash, load_checkpoint
from align.model.family import from_scratch
from align.model.olmoe import ExpertLayout
from align.lora.adapters import LoraConfig
from align.lora.checkpoint import lora_weight_format
from align.lora.stage import inloop_eval, maybe_lora, publish_final
from align.profile import CommonConfig
from align.tokenizer import Tokenizer, TokenizerConfig
from align.tokenizer.tokenizer import resolve_tokenizer_dir
from align.train.callbacks import ProgressLine, SpeedMonitor
from align.train.identity import run_identity
from align.train.moe_module import MoeAuxConfig, build_train_module, moe_callbacks
from align.train.optim import OptimizerConfig
from align.train.parallel import ParallelConfig
from align.train.probes import ProbeConfig, Tripwires
from align.train.rng import seed_all
from align.train.schedulers import SchedulerConfig
from align.train.sft_loss import SftLossConfig
from align.train.sft_module import SftTrainModule
from align.train.train_module import TrainModuleConfig
from align.train.trainer import Trainer, TrainerConfig
from align.utils.dist import device, init_distributed, is_rank0
from align.utils.fsio import atomic_write_json
from align.utils.tracking import read_history

@dataclass(frozen=True)
class SftModelConfig:
    """[model] table: where the weights come from and the dtype they are held in."""

    base: str = ""  # HF checkpoint directory (e.g. a Mistral-7B-v0.3 snapshot); empty: initialise [model.init]
    init: MistralConfig = field(default_factory=MistralConfig)  # shape of a from-scratch model
    moe: ExpertLayout | None = None  # [model.moe]: a from-scratch model with these experts (OLMoE family)
    family: str | None = None  # a from-scratch model of this family (align.model.family, e.g. "qwen3"); None: Mistral
    dtype: Literal["float32", "bfloat16"] = "float32"  # parameter dtype (bf16 pairs with adamw8bit)


@dataclass(frozen=True)
class SftDataConfig:
    """[data] table."""

    shards: str = "shards/sft/out"  # relative to <runs> ($ALIGN_RUNS_DIR, else runs/tiny)
    threads: int = 0  # torch CPU threads per rank; 0: every core
    peak_flops_per_s: float = 0.0  # hardware peak for the MFU column; 0: not reported


@dataclass(frozen=True, kw_only=True)
class SftStageConfig(CommonConfig):
    train: TrainerConfig  # [train]: max_steps is required
    model: SftModelConfig = field(default_factory=SftModelConfig)
    data: SftDataConfig = field(default_factory=SftDataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    loader: LoaderConfig = field(default_factory=LoaderConfig)
    loss: SftLossConfig = field(default_factory=SftLossConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    probes: ProbeConfig = field(default_factory=ProbeConfig)
    inloop_eval: InLoopEvalConfig = field(default_factory=InLoopEvalConfig)
    moe_aux: MoeAuxConfig = field(default_factory=MoeAuxConfig)  # [moe_aux]: MoE models only
    lora: LoraConfig | None = None  # [lora]: train adapters only, publish the merged model (align.lora.stage)


def build_model(cfg: SftStageConfig) -> MistralForCausalLM:
    dtype = DTYPES[cfg.model.dtype]
    seed_all(cfg.run.seed)  # every stream seeded: the same initial weights on every rank and every attempt
    if cfg.model.base:
        return load_checkpoint(cfg.model.base, dtype=dtype, device=device())
    return from_scratch(cfg.model.init, cfg.model.moe, cfg.model.family).to(device=device(), dtype=dtype)


def build_module(cfg, model: MistralForCausalLM, stage: str = "sft") -> SftTrainModule:
    """The next-token CE module over `model` (shared with the pretraining rung, align.stages.pretrain); an MoE
    model's gets the aux objective of `stage` (align.train.moe_module)."""
    module_cfg = TrainModuleConfig(optimizer=cfg.optimizer, scheduler=cfg.scheduler, parallel=cfg.parallel)
    return build_train_module(SftTrainModule, model, module_cfg, cfg.loss, cfg.train.max_steps, seed=cfg.run.seed,
                              moe_aux=cfg.moe_aux, stage=stage)


def base_identity(cfg) -> str:
    """What the run starts from: the base checkpoint's content hash, or the from-scratch shape's digest."""
    if cfg.model.base:
        return checkpoint_content_hash(cfg.model.base)
    return config_digest(cfg.model.init) if cfg.model.moe is None else config_digest(cfg.model)


def fit_and_publish(cfg, module, loader, run_dir: Path, callbacks: list, tok_dir: Path, inputs: dict,
                    lora: LoraConfig | None = None) -> int:
    """Train (resuming a checkpoint of the same run identity), then publish `final/` (collective: every rank;
    with `lora` the merged checkpoint, align.lora.stage.publish_final)."""
    trainer = Trainer(cfg.train, module, loader, run_dir, callbacks, identity=run_identity(cfg, inputs),
                      weight_format=lora_weight_format(lora, module.model, cfg.model.base or None, run_dir))
    code = trainer.fit()
    if code != 0:
        return code
    publish_final(trainer, lora, run_dir / "final", tokenizer_dir=tok_dir, inputs=inputs)
    return 0


def write_metrics(run_dir: Path) -> dict:
    rows = [r for r in read_history(run_dir / "history.jsonl") if r.get("loss") is not None]
    tail = rows[-10:]
    rates = [r["tokens_per_s"] for r in rows[1:] if r.get("tokens_per_s")]
    metrics = {"steps": rows[-1]["step"] if rows else 0, "first_loss": rows[0]["loss"] if rows else None,
               "final_loss": sum(r["loss"] for r in tail) / len(tail) if tail else None,
               "tokens_per_s": sum(rates) / len(rates) if rates else None}
    atomic_write_json(run_dir / "metrics.json", metrics)
    return metrics


def main() -> int:
    cfg = load_cli_config(SftStageConfig, prog="align.stages.sft")
    runs = Path(os.environ.get("ALIGN_RUNS_DIR", "runs/tiny"))
    run_dir = run_dir_from_env(runs / "sft_checkpoint")
    init_distributed(run_dir=run_dir)
    torch.set_num_threads(cfg.data.threads or os.cpu_count() or 1)
    if is_rank0():
        write_resolved_config(cfg, run_dir)
    tok_dir = resolve_tokenizer_dir(cfg.tokenizer.path)
    tok = Tokenizer.from_pretrained(tok_dir, cfg.tokenizer.cache)
    # the identity the shards were built under: the file's sha256, with a Jinja chat template's folded in
    shards = ShardSet.open(runs / cfg.data.shards, kind="sft", tokenizer_hash=tok.content_hash)
    model = maybe_lora(build_model(cfg), cfg.lora, "sft", seed=cfg.run.seed)
    engine_model = model if cfg.inloop_eval.every else None  # copied before wrapping (FSDP2 shards in place)
    n_params = sum(p.numel() for p in model.parameters())
    module = build_module(cfg, model)
    if is_rank0():
        print(f"sft: {n_params / 1e6:.2f}M parameters, {len(shards)} rows; {module.banner}", flush=True)
    loader = BatchLoader(shards, cfg.loader, seed=cfg.run.seed)
    if is_rank0() and cfg.loader.packing != "none":
        st = loader.epoch_stats()
        print(f"sft: packing {cfg.loader.packing}: {st['documents']} conversations in {st['batch_rows']} rows of "
              f"{cfg.loader.seq_len} tokens, {st['padding_fraction']:.1%} padding (epoch 0)", flush=True)
    callbacks = [SpeedMonitor(n_params, cfg.data.peak_flops_per_s or None),
                 Tripwires(cfg.probes, list(module.model.parameters()), model.config.vocab_size),
                 ProgressLine(cfg.train.max_steps, label="sft")]
    inloop = inloop_eval(cfg.inloop_eval, runs, tok, module, cfg.train.max_steps, cfg.lora, engine_model)
    callbacks += [inloop] if inloop is not None else []
    callbacks += moe_callbacks(cfg.moe_aux)
    inputs = {"shards": shards.digest, "base": base_identity(cfg)}
    code = fit_and_publish(cfg, module, loader, run_dir, callbacks, tok_dir, inputs, lora=cfg.lora)
    if code != 0:
        return code
    if is_rank0():
        print(f"sft: {write_metrics(run_dir)}", flush=True)
    return 0


if __name__ == "__main__":
    exit_stage(main)
