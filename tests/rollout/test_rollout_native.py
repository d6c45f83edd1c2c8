"""The native rollout backend: submit/collect, sample grouping and seeds, weight versions, errors, metrics."""

from __future__ import annotations

import pytest

from align.config import from_dict
from align.inference import EngineConfig, SamplingParams
from align.rollout import RolloutConfig, RolloutRequest, make_rollout_client
from inference_helpers import naive_greedy, random_prompts, small_model

PARAMS = SamplingParams(temperature=1.0, max_new_tokens=8)


def requests(prompts, **kw):
    return [RolloutRequest(tuple(p), request_id=i, **kw) for i, p in enumerate(prompts)]


def test_submit_collect_groups_samples_by_request_in_order():
    model = small_model()
    client = make_rollout_client(RolloutConfig(engine=EngineConfig(block_size=4)), model)
    prompts = random_prompts([5, 12, 9], model.config.vocab_size, seed=1)
    t1 = client.submit(requests(prompts, num_samples=3, params=PARAMS, seed=11))
    t2 = client.submit(requests(prompts[:1], num_samples=2, params=PARAMS))
    second = client.collect(t2)  # tickets may be collected out of order
    first = client.collect(t1)
    assert [(r.request_id, r.sample_index) for r in first.results] == [(i, k) for i in range(3) for k in range(3)]
    assert [r.prompt_ids for r in first.results[3:6]] == [tuple(prompts[1])] * 3
    assert all(len(r.completion_ids) == len(r.logprobs) == len(r.model_logprobs) == 8 for r in first.results)
    assert len({r.completion_ids for r in first.results[:3]}) > 1  # the G samples of a prompt differ
    assert len(second.results) == 2
    m = first.metrics
    assert (m.num_requests, m.num_samples, m.num_errors, m.generated_tokens) == (3, 9, 0, 72)
    assert m.prompt_tokens == 3 * (5 + 12 + 9) and m.cached_prompt_tokens > 0  # prefix sharing at work
    assert m.finish_reasons == {"length": 9} and m.weight_version == 0
    with pytest.raises(KeyError, match="ticket"):
        client.collect(t1)


def test_seeded_requests_reproduce_across_clients_tickets_and_company():
    model = small_model()
    prompts = random_prompts([6, 10], model.config.vocab_size, seed=2)
    a = make_rollout_client(RolloutConfig(), model)
    b = make_rollout_client(RolloutConfig(), model)
    b.collect(b.submit(requests(prompts[::-1], num_samples=2, params=PARAMS)))  # advance b's ticket counter
    ra = a.collect(a.submit(requests(prompts, num_samples=4, params=PARAMS, seed=5))).results
    rb = b.collect(b.submit(requests(prompts[1:], num_samples=4, params=PARAMS, seed=5))).results
    assert [r.completion_ids for r in ra[4:]] == [r.completion_ids for r in rb]


def test_weight_update_bumps_the_version_and_changes_samples():
    model, other = small_model(seed=0), small_model(seed=1)
    client = make_rollout_client(RolloutConfig(), model)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=10)
    prompt = random_prompts([8], model.config.vocab_size, seed=3)[0]
    before = client.collect(client.submit(requests([prompt], params=greedy))).results[0]
    assert client.update_weights(other.state_dict()) == 1 and client.weight_version == 1
    after = client.collect(client.submit(requests([prompt], params=greedy))).results[0]
    assert (before.weight_version, after.weight_version) == (0, 1)
    assert list(after.completion_ids) == naive_greedy(other, prompt, 10) != list(before.completion_ids)


def test_a_failing_request_errors_alone():
    model = small_model()
    client = make_rollout_client(RolloutConfig(), model)
    good = random_prompts([7], model.config.vocab_size, seed=4)[0]
    batch = client.collect(client.submit([RolloutRequest(tuple(range(300)), num_samples=2, request_id="long"),
                                          RolloutRequest(tuple(good), num_samples=2, params=PARAMS,
                                                         request_id="ok")]))
    errs = [r for r in batch.results if r.finish_reason == "error"]
    assert [r.request_id for r in errs] == ["long", "long"] and "max_model_len" in errs[0].error
    assert all(len(r.completion_ids) == 8 for r in batch.results if r.request_id == "ok")
    assert batch.metrics.num_errors == 2


def test_config_from_toml_table_and_bad_backend():
    cfg = from_dict(RolloutConfig, {"backend": "native", "seed": 3, "engine": {"block_size": 8,
                                                                               "max_num_seqs": 4}})
    client = make_rollout_client(cfg, small_model())
    assert client.engine.config.block_size == 8 and client.seed == 3
    with pytest.raises(ValueError, match="needs the model"):
        make_rollout_client(cfg)
    with pytest.raises(ValueError, match="num_samples"):
        RolloutRequest((1, 2), num_samples=0)
