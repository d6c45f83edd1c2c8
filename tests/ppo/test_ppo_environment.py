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


def calculator_caller(tok, prompt, turns):
    """A real small policy (hidden 64, 2 layers, the tiny profile's trimmed vocabulary) fitted by plain CE to one
    conversation that calls the calculator, so that its episodes do call it: a few seconds of Adam."""
    from align.model import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    model = MistralForCausalLM(MistralConfig(vocab_size=tok.vocab_size, hidden_size=64, intermediate_size=128,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                             max_position_embeddings=256, eos_token_id=tok.eos_id, pad_token_id=0))
    seq = torch.tensor([prompt + [t for turn in turns for t in turn]])
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(150):
        logits = model(seq)
        loss = torch.nn.functional.cross_entropy(logits[0, len(prompt) - 1:-1], seq[0, len(prompt):])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


def test_a_ppo_step_with_the_calculator_masks_its_answers(tmp_path):
    """The calculator environment as the stage builds it (`episode_runner` on `[environment]`, the tiny tokenizer:
    inline observations) over a policy that calls it: the calculator's answer tokens are exactly the masked ones,
    the verifier rewards the completion, and a PPO step runs on it."""
    import copy

    from align.model.checkpoint import save_checkpoint
    from align.reward.rm_module import critic_from_policy
    from align.rl.batch_source import PromptSet
    from align.rl.curriculum import CurriculumConfig, PromptCurriculum
    from align.rl.environment import episode_runner
    from align.rl.ppo.batch_source import PpoBatchSource
    from align.rl.ppo.gae import GaeConfig
    from align.rl.ppo.loss import PpoLossConfig
    from align.rl.ppo.module import PpoTrainModule
    from align.rl.rewards import CompositeReward, RewardConfig
    from align.rl.stage_config import DynamicSamplingConfig, EnvironmentConfig, RolloutShape
    from align.tokenizer import Tokenizer
    from align.train.optim import OptimizerConfig
    from align.train.schedulers import SchedulerConfig
    from align.train.train_module import TrainModuleConfig
    from rl_fixtures import make_client

    tok = Tokenizer.from_pretrained("mistral-7b-v0.3-tiny")
    prompt = tok.encode_prompt([{"role": "user", "content": "What is 17 * 23?"}])
    answer = tok.encode("<result>391</result>\n")
    model = calculator_caller(tok, prompt, [tok.encode("<calc>17 * 23</calc>\n"), answer,
                                            tok.encode("The answer is \\boxed{391}.") + [tok.eos_id]])
    save_checkpoint(model, tmp_path / "start")
    client = make_client(model)
    client.engine.max_model_len = 128
    shape = RolloutShape(prompts=2, samples=2, max_new_tokens=60, num_minibatches=1, micro_batch_size=4,
                         truncated="keep")
    ppo = PpoConfig(kl_beta=0.0, critic_warmup_rollouts=0)
    cfg = TrainModuleConfig(optimizer=OptimizerConfig(lr=1e-3), scheduler=SchedulerConfig(name="constant"))
    module = PpoTrainModule(copy.deepcopy(model), critic_from_policy(tmp_path / "start", seed=0), cfg,
                            OptimizerConfig(lr=1e-3), PpoLossConfig(), ppo, shape.temperature, 4, client=client)
    prompts = PromptSet(ids=lambda r: tuple(prompt), gold=lambda r: "391", groups=["1"] * 4,
                        meta=lambda r: {"gold": "391"})
    decode = lambda ids: tok.decode(ids, skip_special_tokens=True)  # noqa: E731
    source = PpoBatchSource(prompts, client, decode, CompositeReward(RewardConfig(), shape.max_new_tokens),
                            PromptCurriculum(prompts.groups, CurriculumConfig(), 0, 0, 1), shape,
                            DynamicSamplingConfig(enabled=False), ppo, GaeConfig(), seed=0, eos_id=tok.eos_id,
                            policy_version=lambda: module.version, old_scorer=module.score,
                            value_scorer=module.values,
                            episodes=episode_runner(EnvironmentConfig(max_turns=2), client, tok, shape))
    window = next(iter(source))
    stats = window[0]["stats"]
    assert stats["rollout/env_samples_with_turns"] == 4 and stats["rollout/env_turns"] == 4  # every episode called
    mb = window[0]
    for row in range(mb["completion_ids"].shape[0]):
        n = int(mb["completion_mask"][row].sum())
        masked = [t for t, own in zip(mb["completion_ids"][row, :n].tolist(), mb["policy_mask"][row, :n].tolist())
                  if own == 0]
        assert masked == answer  # the calculator's answer, and nothing else, out of the loss
        assert "<calc>17 * 23</calc>" in decode(mb["completion_ids"][row, :n].tolist())
    assert float(mb["correct"].sum()) == 4 and torch.all(mb["loss_mask"] == mb["completion_mask"] * mb["policy_mask"])
    assert train_window(module, window) is not None
