"""align.eval.inloop: the in-loop held-out evaluation (greedy accuracy through the real Engine, gold-solution NLL),
its cadence and history columns, the weight sync into its own Engine; align.eval.canary's per-level accuracy and the
paired gain interval the GRPO receipt reports."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F

from align.data.collate import collate
from align.data.ingest_parquet import SourceConfig, ingest_source
from align.data.shard_build import ShardBuildConfig, build_shards
from align.data.store import ShardSet
from align.eval.inloop import COLUMNS, build_inloop_eval, engine_copy, heldout_nll
from align.eval.inloop_config import InLoopEvalConfig
from align.model import MistralConfig, MistralForCausalLM
from align.eval.canary import evaluate, paired_gain
from align.rollout.native import NativeRolloutClient
from align.tokenizer import Tokenizer, TokenizerConfig

ROWS = [{"id": f"e{i}", "level": 1 + i % 3, "prompt": f"Mia has {2 + i} pens. She finds {1 + i % 4} more. How many?",
         "answer": str(3 + i + i % 4), "solution": f"{2 + i} + {1 + i % 4} = {3 + i + i % 4}.\n"
                                                   f"The answer is \\boxed{{{3 + i + i % 4}}}."} for i in range(10)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("inloop")
    parquet = tmp / "eval.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), parquet)
    runs = tmp / "runs"
    for split, kind, fmt, cols in (("eval", "prompts", "prompt_answer", {}),
                                   ("eval_sft", "sft", "prompt_response", {"response": "solution"})):
        source = SourceConfig(path=str(parquet), kind=kind, format=fmt, columns=cols, id_column="id",
                              group_column="level")
        ingest_source(split, source, tmp / f"{split}-records")
        build_shards(tmp / f"{split}-records", runs / "shards" / split / "out", TokenizerConfig(),
                     ShardBuildConfig(workers=1))
    return runs


def tiny(seed: int = 0) -> MistralForCausalLM:
    torch.manual_seed(seed)
    return MistralForCausalLM(MistralConfig(vocab_size=32768, hidden_size=32, intermediate_size=64,
                                            num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                            max_position_embeddings=256, pad_token_id=0))


class Module:  # what build_inloop_eval reads of a TrainModule: the live model
    def __init__(self, model):
        self.model = model


def test_heldout_nll_is_torch_cross_entropy_over_the_solution_tokens(runs):
    model = tiny()
    sols = ShardSet.open(runs / "shards/eval_sft/out", kind="sft")
    batch = collate(sols, np.arange(len(sols)))
    logits = model(batch["input_ids"], attention_mask=batch["attention_mask"]).float()
    expected = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), batch["labels"][:, 1:].reshape(-1),
                               ignore_index=-100)
    got = heldout_nll(model, sols, range(len(sols)), batch_rows=3)  # batches of 3: sums, not means, are added
    assert got == pytest.approx(float(expected.detach()), rel=1e-5)
    assert model.training  # restored


def test_callback_columns_cadence_and_weight_sync(runs):
    tok = Tokenizer.from_pretrained(TokenizerConfig().path)
    model = tiny()
    cfg = InLoopEvalConfig(every=3, rows=8, max_new_tokens=8)
    callback = build_inloop_eval(cfg, runs, tok, Module(model), total_steps=7, engine_model=model)

    class T:
        step = 1

    metrics = {}
    callback.observe(T, metrics)
    assert set(COLUMNS) <= set(metrics) and all(math.isnan(metrics[k]) for k in COLUMNS)
    with torch.no_grad():  # the training weights move; the in-loop Engine must see the new ones
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    for step in (3, 7):  # on the cadence, and the last step
        T.step = step
        metrics = {}
        callback.observe(T, metrics)
        assert 0.0 <= metrics["eval/accuracy"] <= 1.0
    fresh = NativeRolloutClient(engine_copy(model))
    reference = evaluate(fresh, callback.task, range(8), 8)
    assert metrics["eval/accuracy"] == reference["pass@1"]
    sols = ShardSet.open(runs / "shards/eval_sft/out", kind="sft")
    assert metrics["eval/nll"] == heldout_nll(model, sols, range(8), 32)


def test_off_builds_nothing_and_a_callback_without_a_model_is_refused(runs):
    tok = Tokenizer.from_pretrained(TokenizerConfig().path)
    assert build_inloop_eval(InLoopEvalConfig(every=0), runs, tok, Module(tiny()), 5, engine_model=tiny()) is None
    with pytest.raises(ValueError, match="engine_model"):
        build_inloop_eval(InLoopEvalConfig(every=2), runs, tok, Module(tiny()), 5)


def test_per_level_accuracy_and_the_right_vector_agree_with_the_total(runs):
    tok = Tokenizer.from_pretrained(TokenizerConfig().path)
    callback = build_inloop_eval(InLoopEvalConfig(every=1, rows=10, max_new_tokens=8), runs, tok,
                                 Module(tiny()), 1, engine_model=tiny())
    always = type(callback.task)(callback.task.ids, callback.task.gold, callback.task.decode,
                                 lambda text, gold: len(text) % 2 == 0, callback.task.eos_id, callback.task.group)
    result = evaluate(callback.client, always, range(10), 8)
    levels = [str(r["level"]) for r in ROWS]
    by_level = result["pass@1_by_group"]
    assert sorted(by_level) == ["1", "2", "3"]
    for level, acc in by_level.items():
        rows = [i for i, lv in enumerate(levels) if lv == level]
        assert acc == pytest.approx(sum(result["right"][i] for i in rows) / len(rows))
    assert sum(result["right"]) / 10 == pytest.approx(result["pass@1"])


def test_paired_gain_interval():
    before = {"right": [0, 0, 1, 1, 0, 1, 0, 0]}
    after = {"right": [1, 0, 1, 0, 1, 1, 1, 0]}
    out = paired_gain(before, after)
    diffs = [1, 0, 0, -1, 1, 0, 1, 0]
    se = statistics.stdev(diffs) / math.sqrt(len(diffs))
    assert out["accuracy_gain_se"] == pytest.approx(se)
    assert out["accuracy_gain_ci95"] == pytest.approx([0.25 - 1.96 * se, 0.25 + 1.96 * se])
    assert (out["rows_gained"], out["rows_lost"]) == (3, 1)
    with pytest.raises(ValueError):
        paired_gain({"right": [1]}, {"right": [1, 0]})
