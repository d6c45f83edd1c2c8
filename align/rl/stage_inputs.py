"""What the GRPO and PPO workers open before they build their modules: the run directory (process group up,
threads set, resolved config written), the start checkpoint's tokenizer, the RL prompt and held-out shards, and the
rollout client holding the start weights (pushing the adapters when the stage trains LoRA adapters)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from align.config import run_dir_from_env, write_resolved_config
from align.data.store import ShardSet
from align.model.checkpoint import DTYPES, load_checkpoint, tokenizer_dir_for
from align.lora.stage import lora_client
from align.rollout import make_rollout_client
from align.tokenizer import Tokenizer
from align.utils.dist import device, init_distributed, is_rank0


@dataclass
class RlStageInputs:
    runs: Path
    run_dir: Path
    start: Path
    tok: Tokenizer
    prompts: ShardSet
    heldout: ShardSet
    client: Any  # a RolloutClient


def open_rl_stage(cfg, task: str) -> RlStageInputs:
    """`cfg`: a GRPO-shaped stage config ([data] start/prompts/eval/engine_dtype/threads, [tokenizer], [rollout],
    optional `lora`); `task`: the stage's default run directory name under runs/."""
    runs = Path(os.environ.get("ALIGN_RUNS_DIR", "runs/tiny"))
    run_dir = run_dir_from_env(runs / task)
    init_distributed(run_dir=run_dir)
    torch.set_num_threads(cfg.data.threads or os.cpu_count() or 1)
    if is_rank0():
        write_resolved_config(cfg, run_dir)
    start = runs / cfg.data.start
    tok = Tokenizer.from_pretrained(tokenizer_dir_for(start) or cfg.tokenizer.path, cfg.tokenizer.cache)
    prompts = ShardSet.open(runs / cfg.data.prompts, kind="prompts", tokenizer_hash=tok.content_hash)
    heldout = ShardSet.open(runs / cfg.data.eval, kind="prompts", tokenizer_hash=tok.content_hash)
    client = make_rollout_client(cfg.rollout, load_checkpoint(start, dtype=DTYPES[cfg.data.engine_dtype],
                                                               device=device()), vocab_limit=tok.vocab_size)
    lora = getattr(cfg, "lora", None)
    client = lora_client(client, lora)  # with [lora]: pushes the adapters (or merged weights, engine_sync)
    return RlStageInputs(runs, run_dir, start, tok, prompts, heldout, client)
