"""The onpolicy_pairs stage worker on a real policy: a tiny model trained here for a few seconds until it mostly
solves eight sums, sampled at temperature 1. Its mistakes become rejected arms, its likeliest right answers the
chosen ones, prompts it always solves keep their source pair; the records feed the shard builder; the result is
the same bytes on a rerun; bad sources are refused by file, row and id with nothing published."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F

from align.data.ingest_parquet import SourceConfig, ingest_source
from align.data.schema import from_row
from align.data.shard_build import ShardBuildConfig, build_shards
from align.data.store import ShardSet
from align.model import MistralConfig, MistralForCausalLM
from align.model.checkpoint import save_checkpoint
from align.tokenizer import Tokenizer, TokenizerConfig
from align.tokenizer.chat import encode_chat
from stage_fixtures import TINY, run_worker

SUMS = [(3 + 7 * i, 2 + i % 9) for i in range(8)]
CONFIG = """include = "common.toml"
[data]
policy = "sft_checkpoint/final"
source = "ingest/pairs/out"
threads = 1
[pairs]
samples = 4
temperature = 1.0
max_new_tokens = 24
"""


def _rows(boxed: bool = True) -> list[dict]:
    def solution(a, b, c):
        return f"{a} + {b} = {c}. The answer is " + (f"\\boxed{{{c}}}." if boxed else f"{c}.")
    return [{"prompt": f"What is {a} + {b}?", "chosen": solution(a, b, a + b), "rejected": solution(a, b, a + b + 1)}
            for a, b in SUMS]


def _trained_policy(out: Path) -> Path:
    """Fit TINY to the eight worked sums (80 Adam steps): it then answers most samples right, not all."""
    tok = Tokenizer.from_pretrained()
    convs = [encode_chat(tok, [{"role": "user", "content": r["prompt"]}, {"role": "assistant", "content": r["chosen"]}])
             for r in _rows()]
    width = max(len(c.ids) for c in convs)
    ids = torch.zeros(len(convs), width, dtype=torch.long)
    labels = torch.full((len(convs), width), -100)
    for i, c in enumerate(convs):
        ids[i, : len(c.ids)] = torch.tensor(c.ids)
        labels[i, : len(c.ids)] = torch.where(torch.tensor(c.loss_mask, dtype=torch.bool), torch.tensor(c.ids), -100)
    torch.manual_seed(0)
    model = MistralForCausalLM(MistralConfig(**TINY, pad_token_id=0))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        # the head only on the labelled positions: the same loss (the others' logits get no gradient), without the
        # [rows, width, 32768] logits of every prompt and padding position
        targets = labels[:, 1:]
        labelled = targets != -100
        for _ in range(80):
            hidden = model.forward_hidden(ids)[:, :-1][labelled]
            loss = F.cross_entropy(model.lm_head(hidden), targets[labelled])
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    return save_checkpoint(model, out)


def _source(tmp: Path, out: Path, rows: list[dict]) -> Path:
    parquet = tmp / f"{out.parent.name}.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    ingest_source("pairs", SourceConfig(path=str(parquet), kind="pairs", format="pair_columns"), out)
    return out


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> Path:
    return _trained_policy(tmp_path_factory.mktemp("policy") / "final")


@pytest.fixture()
def runs(tmp_path, policy):
    runs = tmp_path / "runs"
    (runs / "sft_checkpoint").mkdir(parents=True)
    (runs / "sft_checkpoint" / "final").symlink_to(policy, target_is_directory=True)
    _source(tmp_path, runs / "ingest" / "pairs" / "out", _rows())
    (tmp_path / "common.toml").write_text("[run]\nseed = 5\n")
    (tmp_path / "onpolicy_pairs.toml").write_text(CONFIG)
    return runs


def _run(runs: Path, run_dir: Path, *overrides: str) -> int:
    return run_worker("align.stages.onpolicy_pairs", runs.parent / "onpolicy_pairs.toml", runs, run_dir, *overrides)


def _samples(out: Path) -> dict[int, list[dict]]:
    by_row: dict[int, list[dict]] = {}
    for line in (out / "samples.jsonl").read_text().splitlines():
        r = json.loads(line)
        by_row.setdefault(r["row"], []).append(r)
    return by_row


def test_pairs_are_the_policys_likeliest_mistakes(runs, tmp_path):
    assert _run(runs, runs / "onpolicy_pairs") == 0
    out = runs / "onpolicy_pairs" / "out"
    pairs = [from_row("pairs", r) for r in pq.read_table(out / "records.parquet").to_pylist()]
    source = [from_row("pairs", r) for r in pq.read_table(runs / "ingest/pairs/out/records.parquet").to_pylist()]
    samples = _samples(out)
    assert len(pairs) == len(source) == 8 and sorted(samples) == list(range(8))
    origins = []
    for row, (pair, src) in enumerate(zip(pairs, source)):
        assert (pair.id, pair.prompt, pair.group) == (src.id, src.prompt, src.group)
        usable = [s for s in samples[row] if s["finish_reason"] == "stop" and s["response"].strip()]
        wrong = [s for s in usable if not s["correct"]]
        right = [s for s in usable if s["correct"]]
        if not wrong:
            assert pair == src
            origins.append("offline")
            continue
        assert pair.rejected == max(wrong, key=lambda s: s["model_logprob"])["response"]
        assert pair.chosen == (max(right, key=lambda s: s["model_logprob"])["response"] if right else src.chosen)
        origins.append("policy" if right else "reference")
    # the seed gives every case: a solved prompt, a mistake beside a right sample (and the guard on this test)
    assert "offline" in origins and "policy" in origins

    metrics = json.loads((runs / "onpolicy_pairs" / "metrics.json").read_text())
    assert metrics["pairs"] == 8 and metrics["pairs_offline"] == origins.count("offline")
    assert metrics["samples"] == 32 and metrics["sample_accuracy"] == pytest.approx(
        sum(s["correct"] for g in samples.values() for s in g) / 32)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["kind"] == "records" and manifest["record_kind"] == "pairs"

    # the shard builder takes them like any ingested pairs
    shards = build_shards(out, tmp_path / "shards" / "out", TokenizerConfig(), ShardBuildConfig(workers=1))
    assert shards["rows"] == 8 and ShardSet.open(tmp_path / "shards" / "out", kind="pairs").kind == "pairs"

    # a rerun gives the same records, byte for byte (per-request seeds: batching does not matter)
    assert _run(runs, runs / "again", "engine.max_num_seqs=3") == 0
    assert (runs / "again/out/records.parquet").read_bytes() == (out / "records.parquet").read_bytes()


def test_chosen_without_box_is_refused_by_row_and_id(runs, capsys):
    import shutil

    shutil.rmtree(runs / "ingest" / "pairs")
    _source(runs.parent, runs / "ingest" / "pairs" / "out", _rows(boxed=False))
    assert _run(runs, runs / "onpolicy_pairs") == 2
    err = capsys.readouterr().err
    assert "records.parquet: row 0 (id 'pairs-0')" in err and "\\boxed{}" in err
    assert not (runs / "onpolicy_pairs" / "out").exists()


def test_source_of_another_kind_is_refused(runs, tmp_path, capsys):
    parquet = tmp_path / "prompts.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "What is 1 + 1?", "answer": "2"}]), parquet)
    ingest_source("p", SourceConfig(path=str(parquet), kind="prompts", format="prompt_answer"), runs / "ingest/p/out")
    assert _run(runs, runs / "onpolicy_pairs", "data.source=ingest/p/out") == 2
    assert "kind 'pairs', this one holds 'prompts'" in capsys.readouterr().err
    assert not (runs / "onpolicy_pairs" / "out").exists()
