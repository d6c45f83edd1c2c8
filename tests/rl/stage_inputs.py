"""Real inputs for the GRPO stage tests: prompt and held-out shard sets built by the data pipeline from parquet, and
a tiny checkpoint with the real Mistral v0.3 vocabulary, laid out as a `runs/<profile>/` tree."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from align.data.ingest_parquet import SourceConfig, ingest_source
from align.data.shard_build import ShardBuildConfig, build_shards
from align.model import MistralConfig, MistralForCausalLM
from align.model.checkpoint import save_checkpoint
from align.tokenizer import TokenizerConfig

CONFIG = """include = "common.toml"
[train]
max_steps = {steps}
checkpoint_every = 1
[data]
start = "dpo_checkpoint/final"
eval_rows = 4
threads = 1
[shape]
prompts = 2
samples = 4
max_new_tokens = 6
num_minibatches = 2
micro_batch_size = 4
truncated = "keep"
[dynamic_sampling]
max_rounds = 1
[canary]
every = 2
rows = 2
[optimizer]
lr = 1e-3
[scheduler]
name = "constant"
"""


def prompt_shards(tmp: Path, out: Path, n: int, offset: int = 0) -> Path:
    rows = [{"prompt": f"Tom has {3 + i} apples and finds {1 + i % 5} more. How many apples does Tom have?",
             "answer": str(4 + i + i % 5)} for i in range(offset, offset + n)]
    parquet = tmp / f"{out.parent.name}.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    records = tmp / f"{out.parent.name}-records"
    ingest_source(out.parent.name, SourceConfig(path=str(parquet), kind="prompts", format="prompt_answer"), records)
    build_shards(records, out, TokenizerConfig(), ShardBuildConfig(workers=1))
    return out


def runs_tree(tmp: Path, steps: int) -> tuple[Path, Path]:
    """(runs dir, config file): a tiny start checkpoint, 12 RL prompts, 4 held-out prompts."""
    runs = tmp / "runs"
    torch.manual_seed(0)
    cfg = MistralConfig(vocab_size=32768, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0)
    save_checkpoint(MistralForCausalLM(cfg), runs / "dpo_checkpoint" / "final")
    prompt_shards(tmp, runs / "shards" / "prompts" / "out", 12)
    prompt_shards(tmp, runs / "shards" / "eval" / "out", 4, offset=100)
    configs = tmp / "configs"
    configs.mkdir()
    (configs / "common.toml").write_text("[run]\nseed = 3\n")
    (configs / "grpo.toml").write_text(CONFIG.format(steps=steps))
    return runs, configs / "grpo.toml"
