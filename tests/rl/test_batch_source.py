"""align.rl.batch_source with a real tiny model and the native sampler: windows, dynamic sampling, versions,
staleness and exact resume."""

import pytest
import torch

from align.eval.verifier import RewardResult
from align.rl.batch_source import STAT_KEYS
from align.rl.stage_config import DynamicSamplingConfig, RolloutShape
from rl_fixtures import make_client, make_module, make_source, parity_prompts, tiny_model


def setup(**kw):
    model = tiny_model()
    client = make_client(model)
    module = make_module(model, client)
    return module, client, make_source(module, client, **kw)


def test_a_rollout_becomes_minibatch_windows_of_micro_batches():
    module, client, source = setup()
    # pi_old of the later windows must come from the trainer's scorer, not be copied from the sampler. Whether the
    # two agree bitwise depends on the host's kernels (they did on an Intel host, not on an AMD one), so the scorer's
    # output is marked by a constant shift: the shift shows where the values came from, and undoing it shows that
    # the scorer agrees with the sampler.
    score, shift = source.old_scorer, -1.0
    source.old_scorer = lambda part: score(part) + shift
    it = iter(source)
    w1, w2 = next(it), next(it)
    assert [mb["input_ids"].shape[0] for mb in w1] == [3, 3, 2] == [mb["input_ids"].shape[0] for mb in w2]
    rows = torch.cat([mb["prompt_row"] for mb in w1 + w2])
    assert sorted(rows.bincount().tolist()) == [0] * (16 - 4) + [4] * 4  # 4 prompts x 4 samples
    terms = {f"rollout/term_{kind}/{label}" for kind in ("sum", "failures")  # the [reward] keys' term list
             for label in ("verifier", "format", "length", "truncation")}
    assert set(w1[0]["stats"]) == set(w2[0]["stats"]) == set(STAT_KEYS) | terms
    assert w1[0]["stats"]["rollout/groups_generated"] == 4 and w2[0]["stats"]["rollout/groups_generated"] == 0
    assert "stats" not in w1[1]
    assert all(mb.get("old_from_forward") for mb in w1) and not any("old_from_forward" in mb for mb in w2)
    for mb in w2:  # the trainer's recomputed pi_old agrees with the sampler's log-probs (same fp32 weights)
        m = mb["completion_mask"]
        assert torch.allclose((mb["old_logprobs"] - shift) * m, mb["rollout_logprobs"] * m, atol=1e-4)
    for mb in w1:  # the first window's pi_old is its own forward (old_from_forward): the scorer never ran on it
        m = mb["completion_mask"]
        assert torch.equal(mb["old_logprobs"] * m, mb["rollout_logprobs"] * m)
    batch_adv = torch.cat([mb["advantages"] for mb in w1 + w2])
    batch_rows = torch.cat([mb["prompt_row"] for mb in w1 + w2])
    for row in batch_rows.unique():  # each group's advantages are centred
        assert abs(float(batch_adv[batch_rows == row].sum())) < 1e-5


def test_dynamic_sampling_drops_zero_variance_groups_and_tops_up():
    golds = ["unusable" if r % 4 == 3 else "even" for r in range(16)]
    module, client, source = setup(prompts=parity_prompts(16, golds),
                                   dynamic=DynamicSamplingConfig(enabled=True, max_rounds=3))
    window = next(iter(source))
    s = window[0]["stats"]
    kept, zero_var, invalid, filled = (s[f"rollout/groups_{k}"] for k in ("kept", "zero_var", "invalid", "filled"))
    assert s["rollout/groups_generated"] == kept + zero_var + invalid
    assert kept + filled == 4 and invalid >= 1  # row 3 (unusable gold) is drawn among the first prompts or later
    assert s["rollout/rounds"] >= 2
    rewards = torch.cat([mb["rewards"] for mb in window])
    assert rewards.min() >= 0


def test_all_zero_variance_fills_after_the_retry_budget():
    module, client, source = setup(dynamic=DynamicSamplingConfig(enabled=True, max_rounds=1))
    source.reward.verifier = lambda text, gold: RewardResult(1.0, True, text, "correct")  # every sample right
    s = next(iter(source))[0]["stats"]
    assert (s["rollout/groups_kept"], s["rollout/groups_filled"], s["rollout/rounds"]) == (0, 4, 2)
    assert s["rollout/groups_zero_var"] == 8  # 4 prompts in each of the two rounds


def test_a_sample_from_other_weights_is_refused():
    model = tiny_model()
    client = make_client(model)
    module = make_module(model, client)
    source = make_source(module, client)
    client.update_weights(dict(model.named_parameters()), version=7)  # the engine moved, the policy did not
    with pytest.raises(RuntimeError, match="weight version 7"):
        next(iter(source))


def test_stale_windows_are_refused_and_resampled_from_the_new_weights():
    shape = RolloutShape(prompts=4, samples=4, max_new_tokens=6, num_minibatches=2, micro_batch_size=8,
                         max_staleness=0, on_stale="refuse", truncated="keep")  # the random model never stops:
    module, client, source = setup(shape=shape)  # masked, every completion would leave an empty (unapplied) step
    it = iter(source)
    first = next(it)
    assert int(first[0]["weight_version"][0]) == 0
    module.train_batch(first[0], _accum(module, first))
    module.optim_step()
    module.zero_grads()
    assert client.weight_version == module.version == 1
    second = next(it)  # the rollout's second window lags one step: refused, a fresh rollout comes instead
    assert int(second[0]["weight_version"][0]) == 1 and second[0]["stats"]["rollout/refused_windows"] == 1


def _accum(module, window):
    from align.train.train_module import AccumInfo

    return AccumInfo(0, 1, sum(module.loss_units(mb) for mb in window[:1]), 1)


def test_state_dict_resumes_the_same_windows():
    module, client, source = setup()
    it = iter(source)
    next(it)
    state = source.state_dict()
    want = [next(it), next(it), next(it)]
    module2, client2, source2 = setup()
    source2.load_state_dict(state)
    got = [w for _, w in zip(range(3), iter(source2))]
    for a, b in zip(want, got):
        for ma, mb in zip(a, b):
            assert ma.keys() == mb.keys()
            for k in ma:
                if torch.is_tensor(ma[k]):
                    assert torch.equal(ma[k], mb[k]), k


def test_epochs_pass_over_the_rollout_again_in_a_fresh_order():
    shape = RolloutShape(prompts=4, samples=4, max_new_tokens=6, num_minibatches=2, epochs=2, micro_batch_size=8)
    module, client, source = setup(shape=shape)
    it = iter(source)
    windows = [next(it) for _ in range(4)]
    keys = [tuple(sorted(zip(mb["prompt_row"].tolist(), mb["completion_ids"][:, 0].tolist())))
            for w in windows for mb in w]
    assert sorted(keys[0] + keys[1]) == sorted(keys[2] + keys[3])  # the same 16 samples, twice
    assert keys[0] != keys[2]  # in another order
    assert windows[3][0]["stats"]["rollout/groups_generated"] == 0  # no new rollout yet
    for w in windows[1:]:  # everything after the first step carries a scored pi_old
        m = w[0]["completion_mask"]
        assert "old_from_forward" not in w[0]
        assert torch.allclose(w[0]["old_logprobs"] * m, w[0]["rollout_logprobs"] * m, atol=1e-4)
    assert shape.staleness_bound == 3


def _right_by_text(text, gold):  # about half the samples right, decided by the text alone (so deterministic)
    right = sum(map(ord, text)) % 2 == 0
    return RewardResult(1.0 if right else 0.0, True, text, "correct" if right else "wrong")


def test_max_pass_rate_drops_groups_solved_too_often_and_they_fill_first():
    module, client, source = setup(dynamic=DynamicSamplingConfig(enabled=True, max_rounds=3, max_pass_rate=0.5))
    source.reward.verifier = _right_by_text
    groups, s = source._sample_groups()
    kept, easy, zero_var, filled = (int(s[f"rollout/groups_{k}"]) for k in ("kept", "easy", "zero_var", "filled"))
    assert s["rollout/groups_generated"] == kept + easy + zero_var + s["rollout/groups_invalid"]
    assert easy >= 1 and kept + filled == len(groups) == 4, s  # the text rule solves some groups 3-4 times in 4
    assert all(g.pass_rate <= 0.5 and not g.all_correct for g in groups[:kept])  # kept: the hard ones
    fill = groups[kept:]
    assert all(0.5 < g.pass_rate < 1.0 for g in fill[:easy])  # too-easy groups (a gradient) fill first

    module, client, source = setup(dynamic=DynamicSamplingConfig(enabled=True, max_rounds=3))  # default 1.0
    source.reward.verifier = _right_by_text
    groups, s = source._sample_groups()
    assert s["rollout/groups_easy"] == 0 and any(0.5 < g.pass_rate < 1.0 for g in groups)
    with pytest.raises(ValueError, match="max_pass_rate must be in"):
        DynamicSamplingConfig(max_pass_rate=0.0)
