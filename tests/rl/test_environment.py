"""align.rl.environment: the calculator tool, the multi-turn episode driver on the real engine (a tiny random
policy), and the mask that keeps an environment's observation tokens out of the GRPO loss (with a mutation check)."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from align.rl.assembly import assemble
from align.rl.environment import CalculatorEnv, EnvStep, calculate, run_episode, show
from align.rl.rewards import SampleReward
from align.rl.types import Group, ScoredSample
from rl_fixtures import EOS, decode, make_client, make_module, tiny_model, train_window

OBS = (7, 8, 9)  # what the test environment answers, in the fixtures' "vocabulary" (decode: ids joined by spaces)


def test_calculate_is_exact_and_refuses_everything_but_arithmetic():
    assert calculate("3 * (4 + 5) - 2 ** 3") == 19 and calculate("7 / 2") == Fraction(7, 2)
    assert calculate("-7 // 2") == -4 and calculate("7 % 3") == 1 and calculate("0.1 + 0.2") == Fraction(3, 10)
    assert show(Fraction(7, 2)) == "3.5" and show(Fraction(1, 3)) == "0.333333" and show(Fraction(12)) == "12"
    for bad in ("__import__('os')", "().__class__", "x + 1", "2 ** 1000", "10 ** 64 * 10 ** 64", "1 / 0",
                "'a' * 3", "[1, 2]", "2 ** 0.5", "3 +"):
        with pytest.raises((ValueError, ZeroDivisionError)):
            calculate(bad)


def test_calculator_env_answers_a_call_and_rewards_by_the_verifier():
    env = CalculatorEnv()
    env.reset("What is 17 * 23?", {"gold": "391"})
    assert env.step("I will compute.\n") == EnvStep()
    assert env.step("<calc>17 * 23</calc>\n") == EnvStep("<result>391</result>\n")
    assert env.step("<calc>17 * </calc>\n").observation == "<result>error</result>\n" and env.calls == 2
    assert env.reward("<calc>17 * 23</calc>\n<result>391</result>\nThe answer is \\boxed{391}.") == 1.0
    assert env.reward("The answer is \\boxed{390}.") == 0.0


class EveryLine:
    """A real (trivial) environment: answers every segment with the same observation, done never."""

    def __init__(self):
        self.steps = 0

    def reset(self, prompt, meta):
        self.steps = 0

    def step(self, text):
        self.steps += 1
        return EnvStep(" ".join(map(str, OBS)))

    def reward(self, completion):
        return float(len(completion))


def episode(client, seed=0, max_turns=3, max_tokens=24):
    return run_episode(client, (1, 10, 11), EveryLine(), prompt="", meta={},
                       encode=lambda text: [int(t) for t in text.split()], decode=decode, eos_id=EOS,
                       newline_ids=tuple(range(3, 40)), temperature=1.0, max_tokens=max_tokens,
                       max_turns=max_turns, seed=seed)


def test_episode_interleaves_policy_segments_and_masked_observations():
    client = make_client(tiny_model())
    ep = episode(client)
    ids, mask = list(ep.completion_ids), list(ep.policy_mask)
    assert len(ids) == len(mask) == len(ep.logprobs) <= 24 and ep.turns >= 1
    assert mask.count(0.0) == 3 * ep.turns  # every observation token, and only those, is masked
    for i, m in enumerate(mask):
        if m == 0.0:
            assert ids[i] in OBS and ep.logprobs[i] == 0.0
        else:
            assert ep.logprobs[i] < 0.0  # sampled at temperature 1
    starts = [i for i in range(len(mask)) if mask[i] == 0.0 and (i == 0 or mask[i - 1] == 1.0)]
    assert all(tuple(ids[s:s + 3]) == OBS for s in starts)
    assert ep.finish_reason in ("stop", "length", "turns") and ep.turns <= 3
    assert episode(client) == ep  # a pure function of the weights and the seed
    assert episode(client, seed=1) != ep


def test_budgets_bound_an_episode():
    client = make_client(tiny_model())
    ep = episode(client, max_turns=0, max_tokens=40)
    assert ep.turns == 0 and ep.finish_reason in ("turns", "stop", "length")
    short = episode(client, max_turns=50, max_tokens=6)
    assert len(short.completion_ids) <= 6


def sample(ids, policy_mask, logprobs, total):
    reward = SampleReward(total, float(total), True, 0.0, False)
    return ScoredSample(0, (1, 10, 11), tuple(ids), tuple(logprobs), "stop", 0, reward,
                        None if policy_mask is None else tuple(policy_mask))


def test_observation_tokens_get_no_loss_weight():
    """The policy's update ignores what is recorded at observation positions: the same step whatever their
    behaviour log-probs say. Mutation check: without the mask (assemble ignoring `policy_mask`) the steps differ."""
    ids, mask = [20, 21, 7, 8, 9, 22, EOS], [1, 1, 0, 0, 0, 1, 1]
    logp = [-1.0, -1.2, 0.0, 0.0, 0.0, -0.8, -0.5]
    odd = [x if m else -9.0 for x, m in zip(logp, mask)]  # different "log-probs" on the observation tokens only

    def step(logprobs, masked=True):
        group = Group(0, (sample(ids, mask if masked else None, logprobs, 1.0),
                          sample(ids[:2] + [EOS], None, logp[:2] + [-0.4], 0.0)))
        batch = assemble([group], torch.tensor([[1.0, -1.0]]), "keep")
        batch["old_from_forward"] = False
        model = tiny_model(3)
        module = make_module(model, make_client(model), lr=1e-2)
        train_window(module, [batch])
        return batch, [p.detach().clone() for p in module.model.parameters()]

    batch, a = step(logp)
    assert batch["loss_mask"][0].tolist() == mask and batch["completion_mask"][0].tolist() == [1.0] * 7
    _, b = step(odd)
    assert all(torch.equal(x, y) for x, y in zip(a, b))  # the observation positions carried nothing
    _, c = step(logp, masked=False)
    _, d = step(odd, masked=False)
    assert not all(torch.equal(x, y) for x, y in zip(c, d))  # unmasked, they would have


def test_batched_episodes_equal_single_ones():
    from align.rl.environment import EpisodeStart, run_episodes

    client = make_client(tiny_model())
    starts = [EpisodeStart((1, 10 + i, 11), "", {}, seed=i) for i in range(3)]
    together = run_episodes(client, starts, EveryLine, encode=lambda text: [int(t) for t in text.split()],
                            decode=decode, eos_id=EOS, newline_ids=tuple(range(3, 40)), temperature=1.0,
                            max_tokens=24, max_turns=3)
    alone = [run_episode(client, s.prompt_ids, EveryLine(), prompt="", meta={},
                         encode=lambda text: [int(t) for t in text.split()], decode=decode, eos_id=EOS,
                         newline_ids=tuple(range(3, 40)), temperature=1.0, max_tokens=24, max_turns=3, seed=s.seed)
             for s in starts]
    assert together == alone


def test_grpo_batch_source_drives_episodes_and_masks_observations():
    from functools import partial

    from align.rl.environment import run_episodes
    from align.rl.rewards import RewardConfig
    from align.rl.reward_terms import RewardTermConfig
    from rl_fixtures import make_source, parity_verifier

    model = tiny_model()
    client = make_client(model)
    module = make_module(tiny_model(), client)
    runner = partial(run_episodes, client, make_env=EveryLine, encode=lambda text: [int(t) for t in text.split()],
                     decode=decode, eos_id=EOS, newline_ids=tuple(range(3, 40)), temperature=1.0, max_tokens=6,
                     max_turns=2)
    from align.rl.stage_config import RolloutShape

    shape = RolloutShape(prompts=4, samples=4, max_new_tokens=6, num_minibatches=2, micro_batch_size=3,
                         truncated="keep")  # a cut episode stays in the loss: only observations leave it
    source = make_source(module, client, shape=shape, reward=RewardConfig(terms=(RewardTermConfig("verifier"),)),
                         verifier=parity_verifier)
    source.episodes = runner
    window = next(iter(source))
    masked = sum(float(((mb["completion_mask"] - mb["loss_mask"]) > 0).sum()) for mb in window)
    assert masked > 0  # observations (cut to the token budget at the end), out of the loss
    for mb in window:
        obs = (mb["completion_mask"] > 0) & (mb["loss_mask"] == 0)
        assert set(mb["completion_ids"][obs].tolist()) <= set(OBS)
        assert torch.all(mb["rollout_logprobs"][obs] == 0)
    assert train_window(module, window) is not None  # a GRPO step on it
    from align.rl.grpo_module import rollout_metrics

    stats = window[0]["stats"]
    assert stats["rollout/env_turns"] >= stats["rollout/env_samples_with_turns"] > 0
    assert rollout_metrics(stats)["rollout/tool_call_rate"] == stats["rollout/env_samples_with_turns"] / 16


def test_statistics_leave_out_observation_tokens():
    """`entropy`, `ratio_mean` and `rho_*` average over the policy's own tokens only (a real tiny policy's forward):
    an observation token was not sampled by the policy and its rollout log-prob is 0. Mutation check: without the
    batch's `policy_mask` (the statistics over every completion token) entropy and rho come out different."""
    from align.rl.token_logprobs import completion_logprobs

    ids, mask = [20, 21, 7, 8, 9, 22, 23, EOS], [1, 1, 0, 0, 0, 1, 1, 1]
    logp = [-1.0, -1.2, 0.0, 0.0, 0.0, -0.8, -2.0, -0.5]
    group = Group(0, (sample(ids, mask, logp, 1.0), sample(ids[:2] + [EOS], None, [-1.0, -1.2, -0.4], 0.0)))
    batch = assemble([group], torch.tensor([[1.0, -1.0]]), "keep")
    model = tiny_model(3)
    module = make_module(model, make_client(model))
    scored, entropy = completion_logprobs(model, batch, 1.0, 1024)
    batch["old_logprobs"] = scored.detach()  # pi_old = this policy: rho = exp(old - rollout) away from 1
    own = batch["completion_mask"] * batch["policy_mask"]
    assert own[0].tolist() == mask and own[1].tolist() == [1.0] * 3 + [0.0] * 5

    def metrics(b):
        out = module.loss(module.model, b)
        return module.log_metrics({k: float(v) for k, v in out.sums.items()})

    got = metrics(batch)
    want_entropy = float((entropy * own).sum() / own.sum())
    want_rho = float(((batch["old_logprobs"] - batch["rollout_logprobs"]).abs() * own).sum() / own.sum())
    ratio = torch.exp(scored.detach() - batch["old_logprobs"])
    want_ratio = float((ratio * batch["loss_mask"]).sum() / batch["loss_mask"].sum())
    assert got["entropy"] == pytest.approx(want_entropy, rel=1e-5)
    assert got["rho_abs_log_mean"] == pytest.approx(want_rho, rel=1e-5)
    assert got["ratio_mean"] == pytest.approx(want_ratio, rel=1e-5)
    assert got["rho_capped_frac"] == pytest.approx(float(((batch["old_logprobs"] - batch["rollout_logprobs"]).exp()
                                                          > 2.0).float().mul(own).sum() / own.sum()))
    unmasked = metrics({k: v for k, v in batch.items() if k != "policy_mask"})
    comp = batch["completion_mask"]  # the statistics over every completion token, observations included
    assert unmasked["entropy"] == pytest.approx(float((entropy * comp).sum() / comp.sum()), rel=1e-5)
    assert unmasked["entropy"] != pytest.approx(want_entropy, rel=1e-6)  # a random policy: near-uniform entropy
    assert unmasked["rho_abs_log_mean"] != pytest.approx(want_rho, rel=1e-2)
