"""The grpo_checkpoint worker with a `[reward] terms` list: the reward model loaded from <runs> (its hash in the run's
identity inputs), a user's function in its worker, per-term means in history.jsonl and in metrics.json."""

from __future__ import annotations

import json
import math

from align.model.checkpoint import save_checkpoint
from align.reward.rm_module import critic_from_policy
from align.utils.tracking import read_history
from stage_inputs import runs_tree
from test_grpo_stage import run_worker

TERMS = """
[reward]
terms = [
  { name = "verifier", step_check = true },
  { name = "format", weight = 0.1, layout = "think" },
  { name = "length", buffer = 4, penalty = 0.5 },
  { name = "reward_model", weight = 0.5, path = "rm_checkpoint/final" },
  { name = "python", weight = 0.25, function = "my_terms:short", label = "short" },
]
"""


def test_stage_trains_on_a_term_list(tmp_path, monkeypatch):
    runs, config = runs_tree(tmp_path, steps=2)
    save_checkpoint(critic_from_policy(runs / "dpo_checkpoint" / "final", seed=5), runs / "rm_checkpoint" / "final")
    (tmp_path / "my_terms.py").write_text("def short(prompt, completion, meta):\n"
                                          "    assert meta['gold'] is not None and prompt\n"
                                          "    return 1.0 / (1 + len(completion))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config.write_text(config.read_text() + TERMS)
    run_dir = runs / "terms"
    assert run_worker(monkeypatch, runs, config, run_dir) == 0
    rows = read_history(run_dir / "history.jsonl")
    labels = ("verifier", "format", "length", "reward_model", "short")
    for label in labels:
        values = [r[f"rollout/term_mean/{label}"] for r in rows if r[f"rollout/term_mean/{label}"] is not None]
        assert values and all(math.isfinite(v) for v in values), label
        assert all(r[f"rollout/term_failures/{label}"] == 0 for r in rows)
    short = [r["rollout/term_mean/short"] for r in rows if r["rollout/term_mean/short"] is not None]
    assert all(0 < v <= 1 for v in short)  # the user's function ran on every sample (0 would be a failure)
    receipt = json.loads((run_dir / "metrics.json").read_text())["reward_terms"]
    assert set(receipt) == set(labels) and all(receipt[k]["points"] >= 1 for k in labels)
    manifest = json.loads((run_dir / "final" / "manifest.json").read_text())
    assert "reward_term/reward_model" in json.dumps(manifest)  # the reward model is one of the run's inputs


def test_tasks_depend_on_the_models_a_term_list_names(tmp_path):
    from pipeline.layout import Layout, Project, StageCtx
    from pipeline.stages import grpo, ppo

    layout = Layout(Project(root=tmp_path), "p")
    layout.configs.mkdir(parents=True)
    for stage, name in ((grpo.STAGE, "grpo.toml"), (ppo.STAGE, "ppo.toml")):
        ctx = StageCtx(layout, stage.name)
        (layout.configs / name).write_text('[reward]\noutcome_weight = 1.0\n')
        plain = stage.file_dep(ctx)
        (layout.configs / name).write_text('[reward]\nterms = [{ name = "verifier" }, { name = "reward_model", '
                                           'path = "rm_checkpoint/final" }, { name = "process_reward_model", '
                                           'path = "prm/final" }, { name = "python", function = "m:f" }]\n')
        assert stage.file_dep(ctx) == plain + [layout.runs / "rm_checkpoint/final/manifest.json",
                                               layout.runs / "prm/final/manifest.json"]


def test_stage_runs_calculator_episodes(tmp_path, monkeypatch):
    """[environment] calculator through the real worker: the episodes' rewards reach the history (the random
    policy seldom writes a call; the seam, the masks and the budgets are what this checks end to end)."""
    runs, config = runs_tree(tmp_path, steps=2)
    config.write_text(config.read_text() + "\n[environment]\nname = \"calculator\"\nmax_turns = 2\nmax_tokens = 12\n")
    run_dir = runs / "env"
    assert run_worker(monkeypatch, runs, config, run_dir) == 0
    rows = read_history(run_dir / "history.jsonl")
    assert [r["step"] for r in rows] == [1, 2] and all(r["completion_len"] <= 12 for r in rows)
    assert all(0.0 <= r["rollout/tool_call_rate"] <= 1.0 for r in rows if r["rollout/tool_call_rate"] is not None)
    assert "rollout/tool_call_rate" in rows[0]
