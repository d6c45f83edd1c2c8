"""align.stages.pretrain: continued pretraining on a raw-text corpus (`pretrain_checkpoint`, an optional rung
before SFT).

    python -m align.stages.pretrain --config configs/tiny/pretrain.toml [table.key=value ...]
    torchrun --nproc-per-node N -m align.stages.pretrain --config ...

The corpus (`[corpus.sources.*]`, weighted) is tokenised at start (align.data.pretrain_corpus); training reads it
in the token-addressed order of align.data.token_order (packed documents, document-masked attention, a weighted
mixture), with the SFT stage's loss module (next-token CE on every label token) and the same Trainer (checkpoints,
exact resume, signals, tripwires). The model is `[model].base` or a fresh `[model.init]`, as in SFT; an SFT run
continues from this rung with `[model].base = "runs/<profile>/pretrain_checkpoint/final"`.

Writes into the run directory: `resolved_config.toml`, `history.jsonl` (with `heldout_nll` / `heldout_ppl`),
`checkpoints/step_<N>/`, `final/` (HF format + tokenizer files), `metrics.json` (held-out NLL and perplexity before
and after, the mixture's realised token shares, the corpus's per-source counts and hashes). Exit codes as SFT."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from align.config import load_cli_config, run_dir_from_env, write_resolved_config
from align.data.pretrain_corpus import CorpusConfig, build_corpus
from align.data.token_order import TokenLoader, TokenLoaderConfig, heldout_batches, mixture_documents
from align.exit_codes import exit_stage
from align.profile import CommonConfig
from align.stages.sft import SftModelConfig, base_identity, build_model, build_module, fit_and_publish
from align.tokenizer import Tokenizer, TokenizerConfig
from align.tokenizer.tokenizer import resolve_tokenizer_dir
from align.train.callbacks import ProgressLine, SpeedMonitor
from align.train.heldout import HeldoutConfig, HeldoutPerplexity
from align.train.moe_module import MoeAuxConfig, moe_callbacks
from align.train.optim import OptimizerConfig
from align.train.parallel import ParallelConfig
from align.train.probes import ProbeConfig, Tripwires
from align.train.schedulers import SchedulerConfig
from align.train.sft_loss import SftLossConfig
from align.train.trainer import TrainerConfig
from align.utils.dist import init_distributed, is_rank0
from align.utils.fsio import atomic_write_json


@dataclass(frozen=True, kw_only=True)
class PretrainStageConfig(CommonConfig):
    train: TrainerConfig  # [train]: max_steps is required
    corpus: CorpusConfig
    model: SftModelConfig = field(default_factory=SftModelConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    loader: TokenLoaderConfig = field(default_factory=TokenLoaderConfig)
    heldout: HeldoutConfig = field(default_factory=HeldoutConfig)
    loss: SftLossConfig = field(default_factory=SftLossConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    probes: ProbeConfig = field(default_factory=ProbeConfig)
    moe_aux: MoeAuxConfig = field(default_factory=MoeAuxConfig)  # [moe_aux]: MoE models only
    threads: int = 0  # torch CPU threads per rank; 0: every core


def mixture_shares(loader: TokenLoader) -> dict[str, float]:
    """Token share of each source in epoch 0 of the stream (the weights, as realised by whole documents)."""
    docs, split = mixture_documents(loader.corpus, loader.cfg, loader.seed, 0), loader.corpus.train
    tokens = np.bincount(split.source[docs], weights=split.lengths[docs], minlength=len(loader.corpus.names))
    return {name: float(t / tokens.sum()) for name, t in zip(loader.corpus.names, tokens)}


def write_metrics(run_dir: Path, heldout: HeldoutPerplexity, loader: TokenLoader, corpus) -> dict:
    before, after = heldout.before, heldout.last
    metrics = {"steps": loader.step, "tokens": loader.tokens, "heldout_nll_before": before,
               "heldout_nll_after": after, "heldout_ppl_before": math.exp(before) if before is not None else None,
               "heldout_ppl_after": math.exp(after) if after is not None else None,
               "mixture_shares": mixture_shares(loader),
               "corpus": {name: {k: v for k, v in st.items() if k != "rejections"} for name, st in corpus.stats.items()}}
    atomic_write_json(run_dir / "metrics.json", metrics)
    return metrics


def main() -> int:
    cfg = load_cli_config(PretrainStageConfig, prog="align.stages.pretrain")
    runs = Path(os.environ.get("ALIGN_RUNS_DIR", "runs/tiny"))
    run_dir = run_dir_from_env(runs / "pretrain_checkpoint")
    init_distributed(run_dir=run_dir)
    torch.set_num_threads(cfg.threads or os.cpu_count() or 1)
    if is_rank0():
        write_resolved_config(cfg, run_dir)
    tok_dir = resolve_tokenizer_dir(cfg.tokenizer.path)
    corpus = build_corpus(cfg.corpus, Tokenizer.from_pretrained(tok_dir), os.environ.get("ALIGN_ROOT", "."))
    model = build_model(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    module = build_module(cfg, model, stage="pretrain")
    loader = TokenLoader(corpus, cfg.loader, seed=cfg.run.seed)
    if is_rank0():
        print(f"pretrain: {n_params / 1e6:.2f}M parameters; corpus {len(corpus.train)} documents "
              f"({len(corpus.train.tokens)} tokens), {len(corpus.heldout)} held out; mixture "
              f"{mixture_shares(loader)}; {module.banner}", flush=True)
    h = cfg.heldout
    heldout = HeldoutPerplexity(heldout_batches(corpus, cfg.loader.seq_len, h.batch_size, h.max_windows), h.every,
                                cfg.train.max_steps)
    callbacks = [SpeedMonitor(n_params), heldout,
                 Tripwires(cfg.probes, list(module.model.parameters()), model.config.vocab_size),
                 ProgressLine(cfg.train.max_steps, label="pretrain")]
    inputs = {"corpus": corpus.digest, "base": base_identity(cfg)}
    callbacks += moe_callbacks(cfg.moe_aux)
    code = fit_and_publish(cfg, module, loader, run_dir, callbacks, tok_dir, inputs)
    if code != 0:
        return code
    if is_rank0():
        print(f"pretrain: {write_metrics(run_dir, heldout, loader, corpus)}", flush=True)
    return 0


if __name__ == "__main__":
    exit_stage(main)
