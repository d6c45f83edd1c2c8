"""align.rl.rewards: CompositeReward with the real verifier (align.eval.verifier.score)."""

import pytest

from align.rl.rewards import CompositeReward, RewardConfig, soft_overlong


def test_outcome_is_the_verifier_verdict():
    r = CompositeReward(RewardConfig(), max_new_tokens=64)
    good = r("3 + 4 = 7.\nThe answer is \\boxed{7}.", "7", 12, "stop")
    bad = r("3 + 4 = 8.\nThe answer is \\boxed{8}.", "7", 12, "stop")
    unboxed = r("The answer is 7.", "7", 6, "stop")
    assert (good.total, good.correct, good.format_ok) == (1.0, True, True)
    assert (bad.total, bad.correct, bad.status) == (0.0, False, "wrong")
    assert (unboxed.total, unboxed.format_ok, unboxed.status) == (0.0, False, "unreadable")


def test_format_bonus_and_truncation_penalty():
    r = CompositeReward(RewardConfig(format_weight=0.1, truncation_penalty=0.5), max_new_tokens=16)
    assert r("\\boxed{8}", "7", 5, "stop").total == pytest.approx(0.1)
    cut = r("\\boxed{7}", "7", 16, "length")
    assert cut.truncated and cut.total == pytest.approx(1.0 + 0.1 - 0.5)


def test_soft_overlong_by_hand():
    # L = 20, buffer 8: free up to 12 tokens, then linear to the full penalty at 20
    assert soft_overlong(12, 20, 8, 1.0) == 0.0
    assert soft_overlong(16, 20, 8, 1.0) == pytest.approx(0.5)
    assert soft_overlong(20, 20, 8, 2.0) == pytest.approx(2.0)
    assert soft_overlong(25, 20, 0, 1.0) == 0.0
    r = CompositeReward(RewardConfig(overlong_buffer=8), max_new_tokens=20)
    assert r("\\boxed{7}", "7", 18, "stop").total == pytest.approx(1.0 - 0.75)


def test_unusable_gold_and_sampler_errors_are_invalid():
    r = CompositeReward(RewardConfig(), max_new_tokens=8)
    assert not r("\\boxed{7}", "\\frac{", 3, "stop").valid
    err = r("", "7", 0, "error")
    assert not err.valid and err.status == "error" and not err.correct


def test_kl_shaping_subtracts_the_scaled_sequence_kl():
    r = CompositeReward(RewardConfig(kl_coef=0.2), max_new_tokens=8)
    assert r.needs_reference
    shaped = r.with_kl(r("\\boxed{7}", "7", 3, "stop"), seq_kl=1.5)
    assert shaped.total == pytest.approx(1.0 - 0.3) and shaped.kl == 1.5 and shaped.correct


def test_step_check_withholds_the_outcome_of_a_lucky_answer():
    lucky = " 6 * 4 = 30.\n30 + 7 = 31.\nThe answer is \\boxed{31}."  # right box, false first step
    sound = " 6 * 4 = 24.\n24 + 7 = 31.\nThe answer is \\boxed{31}."
    plain = CompositeReward(RewardConfig(), max_new_tokens=48)
    checked = CompositeReward(RewardConfig(step_check=True), max_new_tokens=48)
    assert plain(lucky, "31", 20, "stop").correct
    gated = checked(lucky, "31", 20, "stop")
    assert (gated.total, gated.correct, gated.status, gated.valid) == (0.0, False, "false_step", True)
    assert checked(sound, "31", 20, "stop").total == 1.0
    assert checked(" 6 * 4 = 30.\n\\boxed{30}", "31", 20, "stop").status == "wrong"  # wrong stays wrong


def test_false_steps_reads_every_binary_equation():
    from align.verify.step_check import false_steps

    assert false_steps("3 + 4 = 7. 10 - 3 = 7. 2 * 5 = 10. 9 / 3 = 3. 2 x 3 = 6. 1.5 + 1.5 = 3") == 0
    assert false_steps("3 + 4 = 8. 10 - 3 = 7. 4 / 0 = 1") == 2
    assert false_steps("The answer is \\boxed{7}.") == 0
