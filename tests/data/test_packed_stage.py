"""The SFT stage worker on packed batches (loader.packing = "ffd"): it trains on real shards, every step's label
tokens are those of its documents, and a run that crashes after its step-2 checkpoint resumes to the same final
weights, bit for bit, as an uninterrupted run (the loader's packed cursor is restored exactly)."""

from __future__ import annotations

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


@pytest.fixture
def run_sft(runs, monkeypatch):
    """Run the worker's main() in this process, as the launcher would run it; `fault` arms align.train.faults."""
    from align.stages import sft

    monkeypatch.setenv("ALIGN_RUNS_DIR", str(runs))
    monkeypatch.setattr(sys, "argv", ["sft", "--config", str(ROOT / "configs/smoke/sft.toml"), *SMALL])
    threads = torch.get_num_threads()

    def run(run_dir: Path, fault: str = "") -> int:
        monkeypatch.setenv("ALIGN_RUN_DIR", str(run_dir))
        monkeypatch.setenv(faults.FAULTS_ENV, fault)
        faults.reset()
        try:
            return run_with_exit_codes(sft.main)
        finally:
            faults.reset()

    yield run
    torch.set_num_threads(threads)
    faults.reset()


def test_packed_sft_stage_trains_and_resumes_exactly(run_sft, tmp_path, capsys):
    assert run_sft(tmp_path / "whole") == 0
    assert "sft: packing ffd: 61 conversations in" in capsys.readouterr().out
    whole = read_history(tmp_path / "whole" / "history.jsonl")
    assert [r["step"] for r in whole] == [1, 2, 3, 4]
    assert all(r["loss_tokens"] > 0 and r["input_tokens"] > 0 for r in whole)

    with pytest.raises(faults.FaultInjected):  # an unexpected error inside step 3, after the step-2 checkpoint
        run_sft(tmp_path / "cut", "crash@micro,step=3,micro=1")
    assert sorted(p.name for p in (tmp_path / "cut" / "checkpoints").iterdir()) == ["step_2"]
    assert run_sft(tmp_path / "cut") == 0  # resumes from step_2
    cut = read_history(tmp_path / "cut" / "history.jsonl")
    assert [(r["step"], r["loss_tokens"], r["loss"]) for r in cut] == [(r["step"], r["loss_tokens"], r["loss"])
                                                                       for r in whole]
    a, b = (load_checkpoint(tmp_path / d / "final").state_dict() for d in ("whole", "cut"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
