"""The SFT stage worker on packed batches (loader.packing = "ffd"): it trains on real shards, every step's label
tokens are those of its documents, and a run that crashes after its step-2 checkpoint resumes to the same final
weights, bit for bit, as an uninterrupted run (the loader's packed cursor is restored exactly)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from align.exit_codes import run_with_exit_codes
from align.model.checkpoint import load_checkpoint
from align.train import faults
from align.utils.tracking import read_history

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["model.init.hidden_size=32", "model.init.intermediate_size=64", "model.init.num_hidden_layers=1",
         "data.threads=1", "train.max_steps=4", "train.checkpoint_every=2", "train.keep_last=2",
         "loader.packing=ffd", "loader.seq_len=160", "loader.micro_batch_size=2", "loader.grad_accum=2"]


@pytest.fixture(scope="module")
def runs(shard_sets, tmp_path_factory) -> Path:
    runs = tmp_path_factory.mktemp("packed_stage")
    (runs / "shards" / "sft").mkdir(parents=True)
    (runs / "shards" / "sft" / "out").symlink_to(shard_sets["sft"])
    return runs


def run_sft(runs: Path, run_dir: Path, fault: str = "") -> int:
    from align.stages import sft

    saved = (dict(os.environ), sys.argv, torch.get_num_threads())
    os.environ.update({"ALIGN_RUNS_DIR": str(runs), "ALIGN_RUN_DIR": str(run_dir), faults.FAULTS_ENV: fault})
    sys.argv = ["sft", "--config", str(ROOT / "configs/smoke/sft.toml"), *SMALL]
    faults.reset()
    try:
        return run_with_exit_codes(sft.main)
    finally:
        os.environ.clear()
        os.environ.update(saved[0])
        sys.argv = saved[1]
        torch.set_num_threads(saved[2])
        faults.reset()


def test_packed_sft_stage_trains_and_resumes_exactly(runs, tmp_path, capsys):
    assert run_sft(runs, tmp_path / "whole") == 0
    assert "sft: packing ffd: 61 conversations in" in capsys.readouterr().out
    whole = read_history(tmp_path / "whole" / "history.jsonl")
    assert [r["step"] for r in whole] == [1, 2, 3, 4]
    assert all(r["loss_tokens"] > 0 and r["input_tokens"] > 0 for r in whole)

    with pytest.raises(faults.FaultInjected):  # an unexpected error inside step 3, after the step-2 checkpoint
        run_sft(runs, tmp_path / "cut", "crash@micro,step=3,micro=1")
    assert sorted(p.name for p in (tmp_path / "cut" / "checkpoints").iterdir()) == ["step_2"]
    assert run_sft(runs, tmp_path / "cut") == 0  # resumes from step_2
    cut = read_history(tmp_path / "cut" / "history.jsonl")
    assert [(r["step"], r["loss_tokens"], r["loss"]) for r in cut] == [(r["step"], r["loss_tokens"], r["loss"])
                                                                       for r in whole]
    a, b = (load_checkpoint(tmp_path / d / "final").state_dict() for d in ("whole", "cut"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
