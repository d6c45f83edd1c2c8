"""align.stages.sft on real artifacts: an SFT shard set built by the data pipeline from a parquet file, the
vendored tokenizer, the profile configs. The worker's main() runs in this process (as the launcher would run it)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from align.config import load_config
from align.data.ingest_parquet import SourceConfig, ingest_source
from align.data.shard_build import ShardBuildConfig, build_shards
from align.exceptions import ConfigError
from align.exit_codes import run_with_exit_codes
from align.stages.sft import SftStageConfig
from align.tokenizer import Tokenizer, TokenizerConfig
from align.utils.manifest import read_manifest
from align.utils.tracking import read_history
from train_helpers import assert_bitwise_equal

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["model.init.hidden_size=32", "model.init.intermediate_size=64", "model.init.num_hidden_layers=1",
         "loader.micro_batch_size=4", "data.threads=1", "train.max_steps=4", "train.checkpoint_every=2"]


@pytest.mark.parametrize("profile", ["tiny", "smoke", "mistral7b", "olmoe_tiny"])
def test_profile_configs_validate(profile):
    cfg = load_config(ROOT / "configs" / profile / "sft.toml", SftStageConfig)
    # a head row per piece of the profile's tokenizer (tiny, olmoe_tiny: the trimmed Mistral v0.3, 555; else 32,768)
    assert cfg.train.max_steps > 0 and cfg.model.init.vocab_size == Tokenizer.from_config(cfg.tokenizer).vocab_size
    if profile == "mistral7b":
        assert cfg.optimizer.name == "adamw8bit" and cfg.parallel.strategy == "fsdp" and cfg.model.base


def test_unknown_key_names_file_and_table(tmp_path):
    bad = tmp_path / "sft.toml"
    bad.write_text('[train]\nmax_steps = 2\n[optimizer]\nlearning_rate = 1.0\n')
    with pytest.raises(ConfigError, match=r"sft.toml: \[optimizer\] unknown key 'learning_rate'"):
        load_config(bad, SftStageConfig)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sft_stage")
    rows = [{"prompt": f"What is {i} plus {i % 7}?" + " Think." * (i % 3),
             "response": f"{i} + {i % 7} = {i + i % 7}.\nThe answer is \\boxed{{{i + i % 7}}}."} for i in range(40)]
    pq.write_table(pa.Table.from_pylist(rows), tmp / "sft.parquet")
    ingest_source("sft", SourceConfig(path=str(tmp / "sft.parquet"), kind="sft", format="prompt_response",
                                      batch_rows=64), tmp / "records")
    runs = tmp / "runs"
    build_shards(tmp / "records", runs / "shards" / "sft" / "out", TokenizerConfig(), ShardBuildConfig(workers=1))
    return runs


def run_sft(runs: Path, run_dir: Path, *overrides: str) -> int:
    from align.stages import sft

    saved = (dict(os.environ), sys.argv, torch.get_num_threads())
    os.environ.update({"ALIGN_RUNS_DIR": str(runs), "ALIGN_RUN_DIR": str(run_dir)})
    sys.argv = ["sft", "--config", str(ROOT / "configs/smoke/sft.toml"), *SMALL, *overrides]
    try:
        return run_with_exit_codes(sft.main)
    finally:
        os.environ.clear()
        os.environ.update(saved[0])
        sys.argv = saved[1]
        torch.set_num_threads(saved[2])


def test_worker_trains_and_publishes_the_run_directory(runs, tmp_path):
    run_dir = tmp_path / "sft"
    assert run_sft(runs, run_dir) == 0
    final = read_manifest(run_dir / "final", kind="hf_checkpoint")
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(final["files"])
    assert set(final["inputs"]) == {"shards", "base"}
    assert (run_dir / "resolved_config.toml").is_file()
    rows = read_history(run_dir / "history.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and rows[-1]["loss"] < rows[0]["loss"]
    assert {"loss", "grad_norm", "lr", "tokens_per_s", "entropy", "probe/weight_update"} <= set(rows[0])
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["steps"] == 4 and metrics["final_loss"] < metrics["first_loss"]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_4"]  # keep_last = 1

    from align.model.checkpoint import load_checkpoint

    first = load_checkpoint(run_dir / "final").state_dict()
    assert run_sft(runs, run_dir) == 0  # a rerun resumes at step 4: nothing to train, the same weights
    assert_bitwise_equal(first, load_checkpoint(run_dir / "final").state_dict())
    assert len(read_history(run_dir / "history.jsonl")) == 4


def test_bad_shards_path_is_one_clear_error(runs, tmp_path, capsys):
    assert run_sft(runs, tmp_path / "sft", "data.shards=shards/nope/out") == 2
    assert "shards/nope/out" in capsys.readouterr().err


@pytest.mark.distributed
def test_two_rank_torchrun_stage_matches_one_rank(runs, tmp_path):
    """torchrun -m align.stages.sft with 2 ranks x 2 micro-batches (FSDP2) equals 1 rank x 4 micro-batches: the
    loader shards one global stream, the loss is normalised by the global token count."""
    import subprocess

    from align.model.checkpoint import load_checkpoint

    if torch.cuda.is_available():
        pytest.skip("the in-process 1-rank run would use the GPU; the 2-rank run is pinned to CPU")

    assert run_sft(runs, tmp_path / "one", "loader.grad_accum=4", "train.max_steps=2") == 0
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), ALIGN_RUNS_DIR=str(runs),
               ALIGN_RUN_DIR=str(tmp_path / "two"), CUDA_VISIBLE_DEVICES="")  # gloo on CPU on any host
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m",
           "align.stages.sft", "--config", str(ROOT / "configs/smoke/sft.toml"), *SMALL, "loader.grad_accum=2",
           "train.max_steps=2"]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    one, two = (load_checkpoint(tmp_path / d / "final").state_dict() for d in ("one", "two"))
    for k in one:
        torch.testing.assert_close(two[k], one[k], rtol=0, atol=1e-6, msg=k)
    rows = [read_history(tmp_path / d / "history.jsonl") for d in ("one", "two")]
    assert [r["loss_tokens"] for r in rows[0]] == [r["loss_tokens"] for r in rows[1]]


def test_moe_model_from_scratch_trains_with_telemetry_and_publishes_olmoe(runs, tmp_path):
    """[model.moe] turns the from-scratch shape into an OLMoE model: the stage trains it through MoETrainModule
    (moe/* history columns, here with a load-balance term), publishes an OLMoE checkpoint in the hub layout, and a
    rerun resumes to the same weights."""
    from align.model.checkpoint import load_checkpoint
    from align.model.olmoe import OlmoeForCausalLM

    moe = ["model.moe.num_experts=4", "model.moe.num_experts_per_tok=2", "moe_aux.load_balance=0.01"]
    run_dir = tmp_path / "sft_moe"
    assert run_sft(runs, run_dir, *moe) == 0
    cfg = json.loads((run_dir / "final" / "config.json").read_text())
    assert cfg["model_type"] == "olmoe" and cfg["num_experts"] == 4
    rows = read_history(run_dir / "history.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and rows[-1]["loss"] < rows[0]["loss"]
    assert {"moe/lb_loss", "moe/max_vio", "moe/utilization", "moe/load_entropy"} <= set(rows[0])
    model = load_checkpoint(run_dir / "final")
    assert isinstance(model, OlmoeForCausalLM)
    first = model.state_dict()
    assert run_sft(runs, run_dir, *moe) == 0
    assert_bitwise_equal(first, load_checkpoint(run_dir / "final").state_dict())


def test_armed_router_collapse_tripwire_halts_the_stage(runs, tmp_path, capsys):
    """[moe_aux] collapse_max_vio arms RouterCollapseTripwire: a threshold of 0 trips at the first window (exit 80,
    the tripwire HALT), naming the rule."""
    moe = ["model.moe.num_experts=4", "model.moe.num_experts_per_tok=2", "moe_aux.collapse_max_vio=0.0"]
    assert run_sft(runs, tmp_path / "sft_collapse", *moe) == 80
    assert "router collapse: MaxVio" in capsys.readouterr().err
