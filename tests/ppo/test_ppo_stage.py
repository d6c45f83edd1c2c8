"""The ppo_checkpoint worker on real artifacts (tokenizer, shards, a checkpoint with the real vocabulary: GRPO's
stage inputs, tests/rl/stage_inputs.py): publishes final/ (the policy), critic/ (the value model) and metrics.json
with GRPO's receipt keys, logs the PPO columns, and a run stopped by SIGTERM mid-rollout (a fault armed by
ALIGN_FAULTS, in a real subprocess) then resumed ends bitwise equal to an uninterrupted one, critic included."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from align.exit_codes import run_with_exit_codes
from align.model.checkpoint import checkpoint_content_hash
from align.utils.tracking import read_history

sys.path.insert(0, str(Path(__file__).parent.parent / "rl"))
from stage_inputs import CONFIG as GRPO_CONFIG  # noqa: E402
from stage_inputs import runs_tree  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
STEPS = 4  # 2 rollouts x 2 minibatches: rollout 0 trains the critic only, rollout 1 both
# GRPO's test config without its [dynamic_sampling] (PPO's stays at its default, off), and PPO's own tables
CONFIG = GRPO_CONFIG.format(steps=STEPS).replace("[dynamic_sampling]\nmax_rounds = 1\n", "") + """[ppo]
kl_beta = 0.05
critic_warmup_rollouts = 1
critic_extra_epochs = 2
[critic_optimizer]
lr = 1e-3
"""


def setup(tmp_path):
    runs, grpo_config = runs_tree(tmp_path, steps=STEPS)
    config = grpo_config.parent / "ppo.toml"
    config.write_text(CONFIG)
    return runs, config


def run_worker(monkeypatch, runs, config, run_dir, *overrides) -> int:
    monkeypatch.setenv("ALIGN_RUNS_DIR", str(runs))
    monkeypatch.setenv("ALIGN_RUN_DIR", str(run_dir))
    monkeypatch.setattr(sys, "argv", ["align.stages.ppo", "--config", str(config), *overrides])
    return run_with_exit_codes(importlib.import_module("align.stages.ppo").main)


def test_stage_publishes_and_sigterm_resume_is_bitwise_equal(tmp_path, monkeypatch):
    runs, config = setup(tmp_path)
    whole = runs / "whole"
    assert run_worker(monkeypatch, runs, config, whole) == 0
    metrics = json.loads((whole / "metrics.json").read_text())
    assert {"start_accuracy", "accuracy", "accuracy_gain", "accuracy_gain_ci95", "accuracy_by_level",
            "reward_first", "reward_last", "reward_slope", "start_checkpoint"} <= set(metrics)
    assert metrics["heldout_rows"] == 4 and metrics["steps"] == STEPS
    rows = read_history(whole / "history.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and [r["critic_only"] for r in rows] == [1, 1, 0, 0]
    for key in ("loss", "policy_loss", "value_loss", "explained_variance", "ratio_mean", "rollout/kl",
                "rollout/gen_s", "canary/pass@1", "health/reward_baseline", "tokens_per_s", "critic_grad_norm"):
        assert key in rows[0], key
    assert [r["critic_extra_steps"] for r in rows] == [2] * STEPS and [r["applied"] for r in rows] == [1] * STEPS
    assert rows[3]["ratio_mean"] is not None and rows[0]["ratio_mean"] is None  # no policy forward in warmup
    assert (whole / "final" / "manifest.json").is_file() and (whole / "critic" / "manifest.json").is_file()
    assert checkpoint_content_hash(whole / "final") != metrics["start_checkpoint"]  # the policy moved

    cut = runs / "cut"  # SIGTERM inside step 3 (rollout 1's first window): checkpoint at 3, exit 128 + 15
    env = {**os.environ, "ALIGN_RUNS_DIR": str(runs), "ALIGN_RUN_DIR": str(cut), "PYTHONPATH": str(ROOT),
           "ALIGN_FAULTS": "signal:TERM@micro,step=3", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "align.stages.ppo", "--config", str(config)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
    assert not (cut / "final").exists() and (cut / "checkpoints" / "step_3").is_dir()
    assert run_worker(monkeypatch, runs, config, cut) == 0
    for name in ("final", "critic"):
        assert checkpoint_content_hash(cut / name) == checkpoint_content_hash(whole / name), name
    a, b = read_history(whole / "history.jsonl"), read_history(cut / "history.jsonl")
    for key in ("loss", "critic_extra_loss_first", "critic_extra_loss_last"):
        assert [r[key] for r in a] == [r[key] for r in b], key


def test_stage_rewards_with_a_reward_model(tmp_path, monkeypatch):
    from align.model.checkpoint import save_checkpoint
    from align.reward.rm_module import critic_from_policy
    from align.utils.manifest import read_manifest

    runs, config = setup(tmp_path)
    rm_dir = runs / "rm_checkpoint" / "final"  # what the rm_checkpoint rung publishes: a value model on the trunk
    save_checkpoint(critic_from_policy(runs / "dpo_checkpoint" / "final", seed=7), rm_dir)
    run_dir = runs / "with_rm"
    assert run_worker(monkeypatch, runs, config, run_dir, "reward.model=rm_checkpoint/final",
                      "reward.model_weight=0.5", "train.max_steps=2") == 0
    rows = read_history(run_dir / "history.jsonl")
    assert rows[0]["rollout/rm_score_mean"] is not None
    final = read_manifest(run_dir / "final", kind="hf_checkpoint")
    assert final["inputs"]["reward_model"] == checkpoint_content_hash(rm_dir)


def test_stage_rewards_steps_with_a_process_reward_model(tmp_path, monkeypatch):
    import torch

    from align.model.checkpoint import load_checkpoint, save_checkpoint
    from align.model.mistral import MistralForProcessReward
    from align.utils.manifest import read_manifest

    runs, config = setup(tmp_path)
    prm_dir = runs / "prm" / "final"  # a PRM on the start's trunk (what align.reward.rm_process trains)
    start = load_checkpoint(runs / "dpo_checkpoint" / "final")
    torch.manual_seed(3)
    prm = MistralForProcessReward(start.config)
    prm.model.load_state_dict(start.model.state_dict())
    save_checkpoint(prm, prm_dir)
    run_dir = runs / "with_prm"
    assert run_worker(monkeypatch, runs, config, run_dir, "reward.process_model=prm/final",
                      "reward.process_weight=0.5", "train.max_steps=2") == 0
    rows = read_history(run_dir / "history.jsonl")
    assert rows[0]["rollout/process_steps"] > 0  # the samples' step ends got the PRM's rewards
    assert 0 < abs(rows[0]["rollout/process_reward_sum"]) <= 0.5 * rows[0]["rollout/process_steps"]
    final = read_manifest(run_dir / "final", kind="hf_checkpoint")
    assert final["inputs"]["process_model"] == checkpoint_content_hash(prm_dir)


def test_task_depends_on_the_reward_model_only_when_named(tmp_path):
    from pipeline.layout import Layout, Project, StageCtx
    from pipeline.stages.ppo import STAGE

    layout = Layout(Project(root=tmp_path), "p")
    layout.configs.mkdir(parents=True)
    (layout.configs / "ppo.toml").write_text('[data]\nstart = "sft_checkpoint/final"\n')
    ctx = StageCtx(layout, STAGE.name)
    deps = [p.relative_to(layout.runs).as_posix() for p in STAGE.file_dep(ctx)]
    assert deps == ["sft_checkpoint/final/manifest.json", "shards/prompts/out/manifest.json",
                    "shards/eval/out/manifest.json"]
    (layout.configs / "ppo.toml").write_text('[reward]\nmodel = "rm_checkpoint/final"\n')
    assert STAGE.file_dep(ctx)[-1] == layout.runs / "rm_checkpoint/final/manifest.json"
    (layout.configs / "ppo.toml").write_text('[reward]\nprocess_model = "prm/final"\n')
    assert STAGE.file_dep(ctx)[-1] == layout.runs / "prm/final/manifest.json"
    assert STAGE.extra and STAGE.optional


def test_stage_with_lora_trains_adapters_and_publishes_the_merged_policy(tmp_path, monkeypatch):
    import torch
    from safetensors.torch import load_file

    runs, config = setup(tmp_path)
    config.write_text(config.read_text() + '\n[lora]\nrank = 4\nalpha = 8.0\ntarget_modules = ["q_proj", "v_proj"]\n')
    run_dir = runs / "lora"
    assert run_worker(monkeypatch, runs, config, run_dir) == 0  # 2 critic-only steps, then 2 with the adapters
    final = load_file(str(run_dir / "final" / "model.safetensors"))
    start = load_file(str(runs / "dpo_checkpoint" / "final" / "model.safetensors"))
    assert final.keys() == start.keys()  # an ordinary (merged) checkpoint
    moved = {k for k in final if not torch.equal(final[k], start[k])}
    assert moved and all(k.endswith(("q_proj.weight", "v_proj.weight")) for k in moved), sorted(moved)[:4]
    critic = load_file(str(run_dir / "critic" / "model.safetensors"))
    assert any(not torch.equal(critic[k], start[k]) for k in critic if k in start and "embed" not in k)


def test_stage_on_two_ranks_trains_what_one_process_does(tmp_path, monkeypatch):
    """torchrun with 2 gloo ranks: the stage samples half the prompts per rank, whitens, averages the critic and
    publishes once; one window per epoch (so both runs train the same rows in every step) gives one process's
    numbers and weights to float-summation noise."""
    import pytest
    import torch
    from safetensors.torch import load_file

    runs, config = setup(tmp_path)
    same_rows = ["shape.num_minibatches=1", "shape.epochs=2"]
    one, two = runs / "one", runs / "two"
    assert run_worker(monkeypatch, runs, config, one, *same_rows) == 0
    env = {**os.environ, "ALIGN_RUNS_DIR": str(runs), "ALIGN_RUN_DIR": str(two), "PYTHONPATH": str(ROOT),
           "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m",
           "align.stages.ppo", "--config", str(config), *same_rows]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    h1, h2 = read_history(one / "history.jsonl"), read_history(two / "history.jsonl")
    assert [r["critic_only"] for r in h2] == [1, 1, 0, 0] and [r["sequences"] for r in h2] == [8] * STEPS
    for a, b in zip(h1, h2):
        for key in ("loss", "value_loss", "critic_grad_norm", "critic_extra_loss_last", "reward_mean"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (key, a["step"])
    for name in ("final", "critic"):
        w1, w2 = load_file(str(one / name / "model.safetensors")), load_file(str(two / name / "model.safetensors"))
        assert w1.keys() == w2.keys()
        assert max(float((w1[k] - w2[k]).abs().max()) for k in w1) <= 1e-4, name
    m1, m2 = (json.loads((d / "metrics.json").read_text()) for d in (one, two))
    assert m1["heldout_rows"] == m2["heldout_rows"] == 4 and m1["start_accuracy"] == m2["start_accuracy"]
