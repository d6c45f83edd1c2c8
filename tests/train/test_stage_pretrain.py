"""align.stages.pretrain (the optional `pretrain_checkpoint` rung) on a generated raw-text corpus: held-out
perplexity falls, a SIGTERM stops at a step boundary and the resumed run ends bitwise equal to an uninterrupted one,
and SFT continues from the published checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from align.config import load_config
from align.data.ingest_parquet import SourceConfig, ingest_source
from align.data.shard_build import ShardBuildConfig, build_shards
from align.data.synthetic_corpus import documents
from align.exit_codes import run_with_exit_codes
from align.model.checkpoint import checkpoint_content_hash, load_checkpoint
from align.stages.pretrain import PretrainStageConfig
from align.tokenizer import TokenizerConfig
from align.utils.manifest import read_manifest
from align.utils.tracking import read_history
from train_helpers import assert_bitwise_equal

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "tiny" / "pretrain.toml"
SMALL = ["model.init.hidden_size=32", "model.init.intermediate_size=64", "model.init.num_hidden_layers=1",
         "loader.seq_len=64", "loader.micro_batch_size=4", "threads=1", "heldout.max_windows=4",
         "scheduler.warmup_steps=2", "train.checkpoint_every=4", "train.keep_last=2"]


def test_tiny_config_validates():
    cfg = load_config(CONFIG, PretrainStageConfig)
    assert set(cfg.corpus.sources) == {"stories", "facts"} and cfg.scheduler.name == "wsd"
    assert all((ROOT / s.path).is_file() for s in cfg.corpus.sources.values())


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A project root holding a small generated corpus at the paths the tiny config names."""
    root = tmp_path_factory.mktemp("pretrain_root")
    (root / "data" / "corpus").mkdir(parents=True)
    for source, n in (("stories", 300), ("facts", 150)):
        pq.write_table(pa.table({"text": documents(source, n)}), root / "data" / "corpus" / f"{source}.parquet")
    return root


def _env(root: Path, run_dir: Path) -> dict:
    return {"ALIGN_ROOT": str(root), "ALIGN_RUN_DIR": str(run_dir), "ALIGN_RUNS_DIR": str(run_dir.parent)}


def run_in_process(module, config: Path, env: dict, *overrides: str) -> int:
    saved = (dict(os.environ), sys.argv, torch.get_num_threads())
    os.environ.update(env)
    sys.argv = ["worker", "--config", str(config), *overrides]
    try:
        return run_with_exit_codes(module.main)
    finally:
        os.environ.clear()
        os.environ.update(saved[0])
        sys.argv = saved[1]
        torch.set_num_threads(saved[2])


def pretrain(root: Path, run_dir: Path, *overrides: str) -> int:
    from align.stages import pretrain as worker

    return run_in_process(worker, CONFIG, _env(root, run_dir), *SMALL, *overrides)


def test_heldout_perplexity_falls_and_the_checkpoint_is_published(root, tmp_path):
    run_dir = tmp_path / "pretrain_checkpoint"
    assert pretrain(root, run_dir, "train.max_steps=24", "heldout.every=8") == 0
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["heldout_ppl_after"] < metrics["heldout_ppl_before"] / 10
    assert metrics["steps"] == 24 and metrics["tokens"] == 24 * 4 * 64
    assert abs(metrics["mixture_shares"]["stories"] - 0.75) < 0.02
    rows = read_history(run_dir / "history.jsonl")
    evaluated = [r["step"] for r in rows if r["heldout_nll"] is not None]
    assert evaluated == [8, 16, 24]
    nll = [r["heldout_nll"] for r in rows if r["heldout_nll"] is not None]
    assert nll == sorted(nll, reverse=True) and nll[-1] == metrics["heldout_nll_after"]
    final = read_manifest(run_dir / "final", kind="hf_checkpoint")
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(final["files"])
    assert set(final["inputs"]) == {"corpus", "base"}


def test_bin_packed_rows_train_too(root, tmp_path):
    run_dir = tmp_path / "pretrain_checkpoint"
    assert pretrain(root, run_dir, "train.max_steps=12", "loader.packing=ffd") == 0
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["heldout_ppl_after"] < metrics["heldout_ppl_before"] / 4  # 32,253 -> 6,070 in 12 steps
    rows = read_history(run_dir / "history.jsonl")
    assert sum(r["input_tokens"] for r in rows) < 12 * 4 * 64  # padded rows: fewer real tokens than row slots


def test_sigterm_resume_is_bitwise_equal(root, tmp_path):
    full, cut = tmp_path / "full" / "pretrain_checkpoint", tmp_path / "cut" / "pretrain_checkpoint"
    assert pretrain(root, full, "train.max_steps=10") == 0
    env = {**os.environ, **_env(root, cut), "ALIGN_FAULTS": "signal:TERM@micro,step=7",
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "align.stages.pretrain", "--config", str(CONFIG), *SMALL,
                           "train.max_steps=10"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-2000:]
    assert sorted(p.name for p in (cut / "checkpoints").iterdir()) == ["step_4", "step_7"]
    assert not (cut / "final").exists()
    assert pretrain(root, cut, "train.max_steps=10") == 0
    assert_bitwise_equal(load_checkpoint(full / "final").state_dict(), load_checkpoint(cut / "final").state_dict())
    a, b = read_history(full / "history.jsonl"), read_history(cut / "history.jsonl")
    assert [r["loss"] for r in a] == [r["loss"] for r in b]
    assert json.loads((full / "metrics.json").read_text())["heldout_nll_before"] == \
        json.loads((cut / "metrics.json").read_text())["heldout_nll_before"]


def test_sft_continues_from_the_pretrained_checkpoint(root, tmp_path):
    from align.stages import sft

    pre = tmp_path / "pretrain_checkpoint"
    # the smoke SFT below runs the full Mistral v0.3 vocabulary; the tiny pretrain config runs the trimmed one
    assert pretrain(root, pre, "train.max_steps=24", "tokenizer.path=mistral-7b-v0.3",
                    "model.init.vocab_size=32768") == 0
    rows = [{"prompt": f"Mia has {i} shells and finds {i % 7} more. How many?",
             "response": f"{i} + {i % 7} = {i + i % 7}.\nThe answer is \\boxed{{{i + i % 7}}}."} for i in range(40)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "sft.parquet")
    ingest_source("sft", SourceConfig(path=str(tmp_path / "sft.parquet"), kind="sft", format="prompt_response"),
                  tmp_path / "records")
    build_shards(tmp_path / "records", tmp_path / "shards" / "sft" / "out", TokenizerConfig(),
                 ShardBuildConfig(workers=1))
    env = {"ALIGN_RUNS_DIR": str(tmp_path), "ALIGN_RUN_DIR": str(tmp_path / "sft_checkpoint")}
    common = ["loader.micro_batch_size=4", "data.threads=1", "train.max_steps=4", "train.checkpoint_every=4"]
    assert run_in_process(sft, ROOT / "configs/smoke/sft.toml", env, *common, f"model.base={pre / 'final'}") == 0
    final = read_manifest(tmp_path / "sft_checkpoint" / "final", kind="hf_checkpoint")
    assert final["inputs"]["base"] == checkpoint_content_hash(pre / "final")
    from_pretrained = read_history(tmp_path / "sft_checkpoint" / "history.jsonl")[0]["loss"]
    scratch = ["model.init.hidden_size=32", "model.init.intermediate_size=64", "model.init.num_hidden_layers=1"]
    env["ALIGN_RUN_DIR"] = str(tmp_path / "scratch" / "sft_checkpoint")
    assert run_in_process(sft, ROOT / "configs/smoke/sft.toml", env, *common, *scratch) == 0
    from_scratch = read_history(tmp_path / "scratch" / "sft_checkpoint" / "history.jsonl")[0]["loss"]
    assert from_pretrained < from_scratch - 1.0  # the arithmetic prose was learnt: SFT starts lower


@pytest.mark.distributed
def test_two_rank_torchrun_pretrain_matches_one_rank(root, tmp_path):
    """2 ranks x 1 micro-batch (FSDP2) read the same token stream as 1 rank x 2: the same loss tokens per step and
    the same weights up to the reduction order."""
    if torch.cuda.is_available():
        pytest.skip("the in-process 1-rank run would use the GPU; the 2-rank run is pinned to CPU")
    one, two = tmp_path / "one" / "pretrain_checkpoint", tmp_path / "two" / "pretrain_checkpoint"
    assert pretrain(root, one, "loader.grad_accum=2", "train.max_steps=3") == 0
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), **_env(root, two), CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m",
           "align.stages.pretrain", "--config", str(CONFIG), *SMALL, "loader.grad_accum=1", "train.max_steps=3"]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = (load_checkpoint(d / "final").state_dict() for d in (one, two))
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-6, msg=k)
    rows = [read_history(d / "history.jsonl") for d in (one, two)]
    assert [r["loss_tokens"] for r in rows[0]] == [r["loss_tokens"] for r in rows[1]]
    assert rows[0][-1]["heldout_nll"] == pytest.approx(rows[1][-1]["heldout_nll"], abs=1e-5)


def test_sft_from_the_rung_depends_on_its_manifest(tmp_path):
    """An sft.toml whose base is the pretraining rung's final/ makes doit build pretrain_checkpoint first."""
    from pipeline.layout import Layout, Project, StageCtx
    from pipeline.stages.pretrain import STAGE as PRETRAIN
    from pipeline.stages.sft import STAGE as SFT

    (tmp_path / "configs" / "p").mkdir(parents=True)
    (tmp_path / "configs" / "p" / "sft.toml").write_text('[model]\nbase = "runs/p/pretrain_checkpoint/final"\n')
    layout = Layout(Project(root=tmp_path), "p")
    manifest = layout.runs / "pretrain_checkpoint" / "final" / "manifest.json"
    assert manifest in SFT.file_dep(StageCtx(layout, "sft_checkpoint"))
    assert PRETRAIN.targets(StageCtx(layout, "pretrain_checkpoint")) == [manifest]
    assert PRETRAIN.contexts(layout) == []  # optional: no pretrain.toml in this profile, no task
