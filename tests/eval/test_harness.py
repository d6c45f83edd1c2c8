"""align.eval.harness: eval prompts through the real Engine, judged by the real verifier."""

from __future__ import annotations

import pytest
import torch

from align.data.evalsets import EVALSETS, get_evalset
from align.data.store import ShardSet
from align.eval.harness import Decoded, Problem, decode, judge, load_problems, verify_settings
from align.eval.metrics import greedy_metrics, sampled_metrics
from align.inference import Engine, EngineConfig, SamplingParams
from align.exceptions import ConfigError
from align.tokenizer import Tokenizer
from align.verify.config import REWARD_CONFIG
from eval_fixtures import answer_model, build_eval_shards, random_model

GOLDS = ["7", "3", "7", "12", "7", "4"]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("eval")
    return ShardSet.open(build_eval_shards(tmp, tmp / "shards", GOLDS))


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_pretrained()


def test_problems_carry_prompt_ids_and_gold(shards, tok):
    problems = load_problems(shards)
    assert [p.gold for p in problems] == GOLDS and [p.row for p in problems] == list(range(len(GOLDS)))
    assert problems[0].prompt_ids[-1] == tok.token_to_id("[/INST]")
    assert len(load_problems(shards, 2)) == 2


@torch.no_grad()
def test_greedy_decode_equals_a_plain_argmax_loop(shards, tok):
    model = random_model(3).eval()
    problems = load_problems(shards, 3)
    out = decode(Engine(model, EngineConfig(max_model_len=128)), tok, problems, SamplingParams(0.0, max_new_tokens=12))
    for d in out:
        ids = list(d.problem.prompt_ids)
        for _ in range(12):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))  # full recompute, no KV cache
        assert list(d.token_ids) == ids[len(d.problem.prompt_ids):]
        assert d.finish_reason == "length" and d.text == tok.decode(d.token_ids, skip_special_tokens=True)


def test_a_model_that_always_answers_7_scores_the_share_of_golds_that_are_7(shards, tok):
    engine = Engine(answer_model(r"The answer is \boxed{7}."), EngineConfig(max_model_len=128))
    problems = load_problems(shards)
    greedy = [judge(d, REWARD_CONFIG) for d in decode(engine, tok, problems, SamplingParams(0.0, max_new_tokens=32))]
    m = greedy_metrics([j for j, _ in greedy])
    assert m["accuracy"] == pytest.approx(3 / 6) and m["format_rate"] == 1.0
    assert m["truncation_rate"] == 0.0 and m["mean_length"] == 10.0  # 9 answer tokens + </s>
    record = greedy[1][1]
    assert record["response"] == r"The answer is \boxed{7}." and record["status"] == "wrong"
    assert record["extracted"] == "7" and record["gold"] == "3" and record["finish_reason"] == "stop"
    sampled = decode(engine, tok, problems, SamplingParams(1.0, max_new_tokens=32), samples=4, seed=9)
    s = sampled_metrics([judge(d, REWARD_CONFIG)[0] for d in sampled], ks=(1, 4))
    assert s["pass_at_k"] == {"1": pytest.approx(0.5), "4": pytest.approx(0.5)} and s["problems"] == 6


def test_a_sample_depends_on_its_seed_row_and_index_not_on_the_batch(shards, tok):
    engine = Engine(random_model(5), EngineConfig(max_model_len=128))
    problems = load_problems(shards)
    params = SamplingParams(1.0, max_new_tokens=10)
    together = decode(engine, tok, problems, params, samples=2, seed=1)
    alone = decode(engine, tok, problems[2:3], params, samples=2, seed=1)
    assert [d.token_ids for d in together if d.problem.row == 2] == [d.token_ids for d in alone]
    assert alone[0].token_ids != alone[1].token_ids  # two samples of one prompt differ
    other_seed = decode(engine, tok, problems[2:3], params, samples=2, seed=2)
    assert [d.token_ids for d in other_seed] != [d.token_ids for d in alone]


def test_a_non_prompt_shard_set_is_refused(tmp_path):
    class Fake:
        kind, path = "pairs", tmp_path

    with pytest.raises(ValueError, match="holds 'pairs' rows"):
        load_problems(Fake())


def _answered(gold: str, text: str = r"The answer is \boxed{0.1429}.") -> Decoded:
    return Decoded(Problem(0, "ev-0", "1", gold, (1, 2, 3)), 0, (4, 5), text, "stop", 0.0)


@pytest.mark.parametrize("evalset", [n for n in sorted(EVALSETS) if get_evalset(n).verify.decimal_min_sig_digits])
def test_an_eval_set_judges_with_its_own_verify_settings(evalset):
    """A decimal of a non-terminating exact gold (0.1429 for 1/7): the RL reward's settings call it wrong (a policy
    is never paid for giving up the exact form), an eval set that declares the numeric-vs-exact tolerance
    (decimal_min_sig_digits) counts it, in the verdict, the metrics record and the samples row."""
    assert verify_settings(evalset) == get_evalset(evalset).verify and verify_settings("") == REWARD_CONFIG
    for gold in (r"\frac{1}{7}", "1/7"):
        judged, record = judge(_answered(gold), verify_settings(evalset))
        assert judged.reward == 1.0 and record["status"] == "correct" and record["reward"] == 1.0
        judged, record = judge(_answered(gold), verify_settings(""))
        assert judged.reward == 0.0 and record["status"] == "wrong"
    for settings in (verify_settings(evalset), verify_settings("")):  # what the tolerance does not reach: alike
        assert judge(_answered("0.1429"), settings)[0].reward == 1.0
        assert judge(_answered("2/7"), settings)[0].reward == 0.0


def test_an_unknown_eval_set_is_refused_listing_the_registered_ones():
    with pytest.raises(ConfigError, match="gsm8k_test"):
        verify_settings("gsm8k")
