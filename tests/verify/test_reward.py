"""align.eval.verifier.score: the GRPO reward contract (1.0 / 0.0 / None) and the format signal."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from align.eval.verifier import RewardResult, score
from align.verify import VerifyConfig, extract_answer

DATA = __import__("pathlib").Path(__file__).resolve().parents[2] / "data" / "raw"


def test_reward_values_and_status():
    assert score(r"so \boxed{42}.", "42") == RewardResult(1.0, True, "42", "correct", "equal")
    wrong = score(r"\boxed{41}", "42")
    assert (wrong.reward, wrong.status, wrong.format_ok) == (0.0, "wrong", True)
    unread = score(r"\boxed{4 \text{ maybe}}", "42")
    assert (unread.reward, unread.status) == (0.0, "unreadable")
    none = score("The answer is 42.", "42")
    assert (none.reward, none.status, none.extracted, none.format_ok) == (0.0, "unreadable", None, False)


def test_unusable_gold_gives_no_reward_even_for_identical_text():
    for response in (r"\boxed{\frac{}", r"\boxed{1}", "no box"):
        result = score(response, r"\frac{")
        assert result.reward is None and result.status == "gold_unusable"
    assert score(r"\boxed{1}", r"\frac{").format_ok is True


@pytest.mark.parametrize("response, ok", [
    (r"\boxed{5}", True), (r"Thus $\boxed{5}$.", True), (r"\boxed{\boxed{5}}", True),
    (r"\boxed{5} \boxed{5}", False), (r"\boxed{4}. No: \boxed{5}", False), (r"\boxed{}", False),
    (r"\boxed{5", False), ("5", False),
])
def test_format_signal_is_exactly_one_nonempty_box(response, ok):
    assert score(response, "5").format_ok is ok


def test_hedging_never_matches_a_scalar_gold():
    for response in (r"\boxed{5}, \boxed{6}", r"\boxed{5, 6}", r"\boxed{5 \text{ or } 6}", r"\boxed{5 \pm 1}",
                     r"\boxed{\{5, 6\}}", r"\boxed{5}\boxed{6}", r"$\boxed{6}$ or $\boxed{5}$"):
        assert score(response, "5").reward == 0.0, response
        assert score(response, "6").reward == 0.0, response


def test_fallback_config():
    cfg = VerifyConfig(fallback=True)
    assert score("#### 1,234", "1234", cfg).reward == 1.0
    assert score("#### 1,234", "1234").reward == 0.0
    assert score("#### 1,234", "1234", cfg).format_ok is False


def test_response_truncation_config():
    response = "x" * 50 + r"\boxed{7}"
    assert score(response, "7", VerifyConfig(max_response_chars=20)).reward == 1.0
    assert score(r"\boxed{7}" + "x" * 50, "7", VerifyConfig(max_response_chars=20)).reward == 0.0


def test_bundled_math_data_scores_as_labelled():
    """The GRPO stage's real input: integer golds, solutions ending in `The answer is \\boxed{N}.`"""
    rows = pq.read_table(DATA / "math_eval.parquet").to_pylist()
    assert rows and all(score(r["solution"], r["answer"]).reward == 1.0 for r in rows)
    pairs = pq.read_table(DATA / "math_pairs.parquet").to_pylist()
    for r in pairs:
        gold = extract_answer(r["chosen"])
        assert score(r["chosen"], gold).reward == 1.0
        assert score(r["rejected"], gold).reward == 0.0, r["id"]
    prompts = pq.read_table(DATA / "math_rl.parquet").to_pylist()
    assert all(score(rf"\boxed{{{p['answer']}}}", p["answer"]).reward == 1.0 for p in prompts)
    assert all(score(rf"\boxed{{{int(p['answer']) + 1}}}", p["answer"]).reward == 0.0 for p in prompts)


def test_reward_keeps_its_box_rule_but_compares_with_the_same_code():
    # are_equivalent reads a whole response; the reward reads only boxes (the format it teaches), then both
    # compare through compare_answers: on every equivalence-corpus pred put in a box they give the same verdict.
    from pathlib import Path

    from verify_corpus import load_corpus

    from align.verify import answer_of, are_equivalent
    from align.verify.config import REWARD_CONFIG

    assert are_equivalent("42", "The answer is 42.") is True and score("The answer is 42.", "42").reward == 0.0
    for case in load_corpus(Path(__file__).with_name("equiv_corpus.txt")):
        if "box" in case.response or answer_of(case.response) != case.response:
            continue  # only bare answers: boxed, each is the same answer
        boxed = score(f"So \\boxed{{{case.response}}}.", case.gold)
        # the same settings on both sides: the reward's (an exact gold needs an exact answer)
        same = are_equivalent(case.gold, case.response, REWARD_CONFIG)
        assert (boxed.reward == 1.0) is same, (case.line, case.gold, case.response)
