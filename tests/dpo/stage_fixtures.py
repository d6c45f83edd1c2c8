"""Real small inputs for the DPO stage tests: a `runs/` tree holding a tiny SFT checkpoint (real Mistral v0.3
vocabulary) and a preference shard set built by the data pipeline from a parquet file, plus a runner for workers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from align.data.ingest_parquet import SourceConfig, ingest_source
from align.data.shard_build import ShardBuildConfig, build_shards
from align.model import MistralConfig, MistralForCausalLM
from align.model.checkpoint import save_checkpoint
from align.tokenizer import TokenizerConfig

TINY = dict(vocab_size=32768, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, rope_theta=10000.0)


def pair_rows(n: int, offset: int = 0) -> list[dict]:
    """Arithmetic pairs: the correct sum vs an off-by-one; the prompt and both answers vary in length."""
    rows = []
    for i in range(offset, offset + n):
        a, b = 3 + 7 * i, 2 + i % 9
        rows.append({"prompt": f"Tom has {a} apples and finds {b} more." + " Count them." * (i % 3),
                     "chosen": f"{a} + {b} = {a + b}. The answer is {a + b}.",
                     "rejected": f"{a} + {b} = {a + b + 1}. The answer is {a + b + 1}."})
    return rows


def build_pair_shards(tmp: Path, out: Path, rows: list[dict]) -> Path:
    parquet = tmp / f"{out.parent.name}-pairs.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    records = tmp / f"{out.parent.name}-records"
    ingest_source("pairs", SourceConfig(path=str(parquet), kind="pairs", format="pair_columns", batch_rows=64),
                  records)
    build_shards(records, out, TokenizerConfig(), ShardBuildConfig(workers=1))
    return out


def save_tiny_checkpoint(out: Path, seed: int) -> Path:
    torch.manual_seed(seed)
    model = MistralForCausalLM(MistralConfig(**TINY, pad_token_id=0))
    return save_checkpoint(model, out)


def run_worker(module: str, config: Path, runs: Path, run_dir: Path, *overrides: str) -> int:
    """Run a stage worker's main() in this process (as the launcher would, minus the subprocess)."""
    import importlib

    from align.exit_codes import run_with_exit_codes

    env = {"ALIGN_RUNS_DIR": str(runs), "ALIGN_RUN_DIR": str(run_dir)}
    saved_env = {k: os.environ.get(k) for k in env}
    saved_argv, saved_threads = sys.argv, torch.get_num_threads()
    os.environ.update(env)
    sys.argv = [module, "--config", str(config), *overrides]
    try:
        return run_with_exit_codes(importlib.import_module(module).main)
    finally:
        sys.argv = saved_argv
        torch.set_num_threads(saved_threads)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
