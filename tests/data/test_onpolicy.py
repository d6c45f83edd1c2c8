"""align.data.onpolicy: which of a prompt's judged samples become the chosen and rejected arms."""

from __future__ import annotations

import pytest

from align.data.onpolicy import JudgedSample, OnPolicyConfig, choose_pair, summarise
from align.data.schema import Message, PreferencePair

SOURCE = PreferencePair("pair-1", (Message("user", "Q?"),), "ref right \\boxed{5}", "ref wrong \\boxed{6}", "2")


def s(text, correct, ended=True, lp=-1.0):
    return JudgedSample(text, correct, ended, lp)


def test_likeliest_wrong_is_rejected_and_likeliest_right_is_chosen():
    samples = [s("w1", False, lp=-5.0), s("r1", True, lp=-3.0), s("w2", False, lp=-2.0), s("r2", True, lp=-4.0)]
    c = choose_pair(SOURCE, samples, OnPolicyConfig())
    assert c.origin == "onpolicy" and c.chosen_from_policy
    assert (c.pair.chosen, c.pair.rejected) == ("r1", "w2")
    assert c.pair.id == SOURCE.id and c.pair.prompt == SOURCE.prompt and c.pair.group == SOURCE.group
    assert c.logprob_margin == pytest.approx(-1.0)  # the policy prefers its mistake: a pair DPO can still fix


def test_first_and_reference_options():
    samples = [s("w1", False, lp=-5.0), s("r1", True, lp=-3.0), s("w2", False, lp=-2.0)]
    c = choose_pair(SOURCE, samples, OnPolicyConfig(rejected="first", chosen="reference"))
    assert (c.pair.chosen, c.pair.rejected) == (SOURCE.chosen, "w1")
    assert not c.chosen_from_policy and c.logprob_margin is None


def test_cut_and_empty_samples_are_never_arms():
    samples = [s("cut wrong", False, ended=False, lp=0.0), s("   ", False, lp=-0.1), s("w", False, lp=-9.0),
               s("cut right", True, ended=False, lp=0.0)]
    c = choose_pair(SOURCE, samples, OnPolicyConfig())
    assert (c.pair.chosen, c.pair.rejected) == (SOURCE.chosen, "w")  # no usable right sample: the reference
    assert c.origin == "onpolicy" and not c.chosen_from_policy


def test_solved_prompt_keeps_the_source_pair_or_is_dropped():
    samples = [s("r1", True), s("r2", True), s("cut", False, ended=False)]
    kept = choose_pair(SOURCE, samples, OnPolicyConfig())
    assert kept.origin == "offline" and kept.pair == SOURCE
    dropped = choose_pair(SOURCE, samples, OnPolicyConfig(when_solved="drop"))
    assert dropped.origin == "dropped" and dropped.pair is None


def test_summary_counts():
    groups = [[s("w", False, lp=-1.0), s("r", True, lp=-2.0)],  # on-policy, policy prefers the mistake
              [s("r", True), s("r2", True)],  # solved: offline
              [s("w", False, lp=-3.0), s("x", False, ended=False)]]  # on-policy, reference chosen
    cfg = OnPolicyConfig()
    choices = [choose_pair(SOURCE, g, cfg) for g in groups]
    m = summarise(choices, [x for g in groups for x in g])
    assert m == {"prompts": 3, "samples": 6, "sample_accuracy": 0.5, "samples_cut": 1, "pairs": 3,
                 "pairs_onpolicy": 2, "pairs_offline": 1, "dropped": 0, "chosen_from_policy": 1,
                 "policy_prefers_rejected": 1.0}
    empty = summarise([], [])
    assert empty["sample_accuracy"] is None and empty["policy_prefers_rejected"] is None


@pytest.mark.parametrize("bad", [dict(samples=0), dict(max_new_tokens=0), dict(temperature=0.0),
                                 dict(max_prompts=-1)])
def test_config_refuses_bad_values(bad):
    with pytest.raises(ValueError, match="pairs"):
        OnPolicyConfig(**bad)
