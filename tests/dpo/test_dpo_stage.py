"""The dpo stage worker on real artifacts (tiny SFT checkpoint, preference shards, the ref_cache stage's cache):
trains without loading a reference model, logs rewards, records held-out SFT vs DPO preference accuracy, refuses a
cache with another key, and resumes to bitwise the same weights as an uninterrupted run."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from align.utils.tracking import read_history
from stage_fixtures import build_pair_shards, pair_rows, run_worker, save_tiny_checkpoint

REF_CONFIG = """include = "common.toml"
[scoring]
batch_pairs = 8
threads = 1
"""
DPO_CONFIG = """include = "common.toml"
[train]
max_steps = 4
[data]
heldout_every = 5
eval_batch_pairs = 8
threads = 1
[loader]
micro_batch_size = 4
[loss]
beta = 0.5
nll_alpha = 0.1
chunk_size = 64
[optimizer]
lr = 1e-3
[scheduler]
name = "constant"
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dpo_stage")
    runs = tmp / "runs"
    save_tiny_checkpoint(runs / "sft_checkpoint" / "final", seed=0)
    build_pair_shards(tmp, runs / "shards" / "preference" / "out", pair_rows(20))
    (tmp / "common.toml").write_text("[run]\nseed = 5\n")
    (tmp / "ref_cache.toml").write_text(REF_CONFIG)
    (tmp / "dpo.toml").write_text(DPO_CONFIG)
    assert run_worker("align.stages.ref_cache", tmp / "ref_cache.toml", runs, runs / "ref_cache") == 0
    return runs


def _dpo(runs, run_dir, *overrides):
    return run_worker("align.stages.dpo", runs.parent / "dpo.toml", runs, run_dir, *overrides)


def test_trains_logs_rewards_and_records_heldout_accuracy(runs, monkeypatch):
    import align.stages.dpo as stage

    loads = []
    real = stage.load_checkpoint
    monkeypatch.setattr(stage, "load_checkpoint", lambda *a, **k: loads.append(a) or real(*a, **k))
    run_dir = runs / "dpo_a"
    assert _dpo(runs, run_dir) == 0
    assert len(loads) == 1  # the policy's initial weights; no reference model
    assert (run_dir / "final" / "manifest.json").is_file()
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["heldout_pairs"] == 4 and metrics["train_pairs"] == 16 and metrics["steps"] == 4
    for key in ("sft_preference_accuracy", "dpo_preference_accuracy", "dpo_reward_accuracy", "dpo_reward_margin"):
        assert 0.0 <= metrics[key] <= 1.0 or key == "dpo_reward_margin"
    rows = read_history(run_dir / "history.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[0]["rewards/margin"] == pytest.approx(0.0, abs=1e-5)  # step 1: the policy is the reference
    assert all(r["pairs"] == 4 for r in rows) and rows[-1]["rewards/accuracy"] >= 0.0


def test_a_cache_with_another_key_is_refused(runs, capsys):
    assert _dpo(runs, runs / "dpo_bad", "data.ref_dtype=bfloat16") == 2
    err = capsys.readouterr().err
    assert "key mismatch" in err and "dtype: cache has 'float32', expected 'bfloat16'" in err
    assert not (runs / "dpo_bad" / "final").exists()


def test_resume_is_bitwise_equal_to_an_uninterrupted_run(runs):
    whole, parts = runs / "dpo_whole", runs / "dpo_parts"
    assert _dpo(runs, whole) == 0
    # a 0 s wall budget stops after step 1 with a checkpoint (exit 82); a smaller train.max_steps would be another
    # run's identity, so the second call would train from scratch instead of resuming
    assert _dpo(runs, parts, "train.max_wall_seconds=0") == 82
    assert [c.name for c in (parts / "checkpoints").glob("step_*")] == ["step_1"]
    assert _dpo(runs, parts) == 0  # resumes from checkpoints/step_1 and trains steps 2-4
    assert not (parts / "checkpoints.superseded").exists()  # it did resume
    a, b = load_file(str(whole / "final" / "model.safetensors")), load_file(str(parts / "final" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [r["step"] for r in read_history(parts / "history.jsonl")] == [1, 2, 3, 4]


@pytest.mark.slow
@pytest.mark.distributed
def test_two_rank_fsdp_run_matches_one_rank(runs):
    """torchrun, 2 gloo ranks, FSDP2: 2 pairs per rank per step trains like 4 pairs on one rank (same global
    batch, loss normalised by the global pair count) and the held-out evaluation runs through the sharded unit.
    Step 1 (same weights) must agree in loss, gradient norm and rewards; later steps only roughly: Adam's first
    update is lr * sign(g), so reduction-order noise in near-zero gradient elements becomes lr-sized weight
    differences. No NLL term, whose token mean is per micro-batch."""
    import os
    import subprocess
    import sys

    one, two = runs / "dpo_one", runs / "dpo_two"
    assert _dpo(runs, one, "loss.nll_alpha=0.0") == 0
    env = {**os.environ, "ALIGN_RUNS_DIR": str(runs), "ALIGN_RUN_DIR": str(two), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m",
           "align.stages.dpo", "--config", str(runs.parent / "dpo.toml"), "loader.micro_batch_size=2",
           "loss.nll_alpha=0.0"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    h1, h2 = read_history(one / "history.jsonl"), read_history(two / "history.jsonl")
    assert len(h1) == len(h2) == 4
    for key in ("loss", "grad_norm", "logps/chosen", "logps/rejected"):
        assert h2[0][key] == pytest.approx(h1[0][key], rel=1e-5), key
    assert [r["loss"] for r in h2] == pytest.approx([r["loss"] for r in h1], rel=2e-2)
    m1, m2 = (json.loads((d / "metrics.json").read_text()) for d in (one, two))
    assert m1["heldout_pairs"] == m2["heldout_pairs"] == 4
    assert m2["sft_preference_accuracy"] == m1["sft_preference_accuracy"]
    assert m2["dpo_reward_margin"] == pytest.approx(m1["dpo_reward_margin"], rel=0.2, abs=1e-3)


@pytest.mark.parametrize("profile", ["tiny", "smoke", "mistral7b"])
def test_profile_configs_load(profile):
    from pathlib import Path

    from align.config import load_config
    from align.stages.dpo import DpoStageConfig
    from align.stages.ref_cache import RefCacheStageConfig

    configs = Path(__file__).resolve().parents[2] / "configs" / profile
    dpo = load_config(configs / "dpo.toml", DpoStageConfig)
    ref = load_config(configs / "ref_cache.toml", RefCacheStageConfig)
    assert dpo.data.ref_dtype == ref.scoring.dtype  # else the DPO stage refuses the cache (key mismatch)
    assert dpo.data.reference == ref.reference and dpo.data.pairs == ref.splits["preference"]
