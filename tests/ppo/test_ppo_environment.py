"""PPO with `[environment]` (multi-turn episodes through GRPO's episode runner, align.rl.environment): the
environment's observation tokens carry no loss, no advantage, no return and no KL; GAE runs over the policy's
tokens as if the observations were not there; a PPO step trains on it; and the ppo_checkpoint worker runs the
calculator environment end to end."""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

import torch

from align.rl.environment import EnvStep, run_episodes
from align.rl.ppo.gae import gae, gather_columns, policy_columns, scatter_columns
from align.rl.ppo.stage_config import PpoConfig
from align.utils.tracking import read_history
from ppo_fixtures import make_ppo
from rl_fixtures import EOS, decode, train_window

OBS = (7, 8, 9)


class EveryLine:
    """A real (trivial) environment: answers every segment with the same three tokens."""

    def reset(self, prompt, meta):
        pass

    def step(self, text):
        return EnvStep(" ".join(map(str, OBS)))

    def reward(self, completion):
        return 0.0


def with_episodes(source, client, max_tokens=8):
    source.episodes = partial(run_episodes, client, make_env=EveryLine,
                              encode=lambda text: [int(t) for t in text.split()], decode=decode, eos_id=EOS,
                              newline_ids=tuple(range(3, 40)), temperature=1.0, max_tokens=max_tokens, max_turns=2)
    return source


def test_policy_columns_run_gae_as_if_the_observations_were_absent():
    torch.manual_seed(0)
    own = torch.tensor([[1, 1, 0, 0, 1, 1, 0], [1, 0, 1, 0, 0, 0, 0]], dtype=torch.float32)
    rewards, values = torch.randn(2, 7).double(), torch.randn(2, 7).double()
    order = policy_columns(own)
    adv, ret = (scatter_columns(x, order) for x in gae(gather_columns(rewards, order), gather_columns(values, order),
                                                        gather_columns(own, order), 0.9, 0.8))
    for row in range(2):
        keep = own[row].bool()
        r, v = rewards[row, keep][None], values[row, keep][None]  # the observation columns deleted
        a, g = gae(r, v, torch.ones_like(r), 0.9, 0.8)
        assert torch.equal(adv[row, keep], a[0]) and torch.equal(ret[row, keep], g[0])
        assert torch.all(adv[row, ~keep] == 0) and torch.all(ret[row, ~keep] == 0)


def test_a_ppo_step_on_episodes_masks_the_observation_tokens(tmp_path):
    module, client, source = make_ppo(tmp_path, ppo=PpoConfig(kl_beta=0.05, critic_warmup_rollouts=0))
    with_episodes(source, client)
    window = next(iter(source))
    obs_tokens = 0
    for mb in window:
        obs = (mb["completion_mask"] > 0) & (mb["policy_mask"] == 0)
        obs_tokens += int(obs.sum())
        assert set(mb["completion_ids"][obs].tolist()) <= set(OBS)
        assert torch.all(mb["loss_mask"][obs] == 0) and torch.all(mb["rollout_logprobs"][obs] == 0)
        assert torch.all(mb["token_advantages"][obs] == 0) and torch.all(mb["returns"][obs] == 0)
    assert obs_tokens > 0
    stats = window[0]["stats"]
    assert stats["rollout/env_turns"] > 0 and stats["rollout/kl_tokens"] < stats["rollout/gen_tokens"]
    before = [p.detach().clone() for p in module.model.parameters()]
    train_window(module, window)
    assert any(not torch.equal(a, p) for a, p in zip(before, module.model.parameters()))  # a PPO step trained


def test_the_observations_log_probs_never_reach_the_update(tmp_path):
    """Mutation check: the same window with other numbers at the observation positions of every per-token tensor
    the loss reads gives the same update; without the loss mask there (observations as if the policy's) it differs."""
    def step(edit):
        module, client, source = make_ppo(tmp_path, ppo=PpoConfig(critic_warmup_rollouts=0))
        window = next(iter(with_episodes(source, client)))
        train_window(module, window, edit)
        return [p.detach().clone() for p in module.model.parameters()]

    def obs(mb):
        return (mb["completion_mask"] > 0) & (mb["policy_mask"] == 0)

    def noisy(mb):
        return {k: mb[k].masked_fill(obs(mb), 3.0) for k in ("old_logprobs", "rollout_logprobs", "token_advantages",
                                                              "returns", "old_values")}

    base = step(None)
    assert all(torch.equal(a, b) for a, b in zip(base, step(noisy)))
    leaky = step(lambda mb: {**noisy(mb), "loss_mask": mb["completion_mask"].clone()})
    assert not all(torch.equal(a, b) for a, b in zip(base, leaky))


def test_stage_runs_calculator_episodes(tmp_path, monkeypatch):
    """[environment] calculator through the real ppo_checkpoint worker (the random policy seldom writes a call: the
    seam, the masks and the budgets are what this checks end to end)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from test_ppo_stage import run_worker, setup

    runs, config = setup(tmp_path)
    config.write_text(config.read_text().replace("max_steps = 4", "max_steps = 2")
                      + "\n[environment]\nname = \"calculator\"\nmax_turns = 2\nmax_tokens = 12\n")
    run_dir = runs / "env"
    assert run_worker(monkeypatch, runs, config, run_dir) == 0
    rows = read_history(run_dir / "history.jsonl")
    assert [r["step"] for r in rows] == [1, 2] and all(r["completion_len"] <= 12 for r in rows)
    assert "rollout/tool_call_rate" in rows[0] and "rollout/env_turns" in rows[0]
