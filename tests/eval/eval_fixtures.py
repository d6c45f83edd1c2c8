"""Real small inputs for the eval tests: an eval prompt shard set built by the data pipeline from a parquet file,
and two tiny checkpoints with the real Mistral v0.3 vocabulary:

- `random`: a seeded random model (rambles until max_new_tokens);
- `answer_model(text)`: a hand-built bigram model whose greedy continuation of any chat prompt is exactly `text`
  then `</s>`. Every layer's output projections are zero, so each layer passes the residual through and the logits
  depend on the current token only; the LM head maps each token of the chain to the next with a large margin. It
  answers every problem the same, so accuracy is exactly the fraction of problems whose gold is that answer, and
  sampling at temperature 1 still follows the chain (the margin makes other tokens improbable)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from align.data.ingest_parquet import SourceConfig, ingest_source
from align.data.shard_build import ShardBuildConfig, build_shards
from align.model import MistralConfig, MistralForCausalLM
from align.model.checkpoint import save_checkpoint
from align.tokenizer import Tokenizer, TokenizerConfig

TINY = dict(vocab_size=32768, hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, rope_theta=10000.0, pad_token_id=0)
MARGIN = 40.0  # logit of the chain's next token; exp(-40) * 32768 leaves no room for another token


def eval_rows(golds: list[str]) -> list[dict]:
    return [{"id": f"ev-{i}", "prompt": f"Tom has {i + 2} apples and finds {len(g)} more. How many now?",
             "answer": g, "level": str(1 + i % 3)} for i, g in enumerate(golds)]


def build_eval_shards(tmp: Path, out: Path, golds: list[str]) -> Path:
    parquet = tmp / "eval.parquet"
    pq.write_table(pa.Table.from_pylist(eval_rows(golds)), parquet)
    records = tmp / "eval-records"
    src = SourceConfig(path=str(parquet), kind="prompts", format="prompt_answer", id_column="id",
                       group_column="level", batch_rows=64)
    ingest_source("eval", src, records)
    build_shards(records, out, TokenizerConfig(), ShardBuildConfig(workers=1))
    return out


def random_model(seed: int = 0) -> MistralForCausalLM:
    torch.manual_seed(seed)
    return MistralForCausalLM(MistralConfig(**TINY, tie_word_embeddings=False))


@torch.no_grad()
def answer_model(text: str, seed: int = 0) -> MistralForCausalLM:
    tok = Tokenizer.from_pretrained()
    chain = [tok.token_to_id("[/INST]"), *tok.encode(text), tok.eos_id]
    if len(set(chain[:-1])) != len(chain) - 1:
        raise ValueError(f"{text!r}: a repeated token would make the bigram chain ambiguous")
    model = random_model(seed)
    for layer in model.model.layers:
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
    model.lm_head.weight.zero_()
    hidden = model.forward_hidden(torch.tensor([chain[:-1]]))[0]  # shape: (T, D), each row depends on its token only
    for h, nxt in zip(hidden, chain[1:]):
        model.lm_head.weight[nxt] = MARGIN * h / h.dot(h)
    return model


def save(model, out: Path) -> Path:
    return save_checkpoint(model, out)
