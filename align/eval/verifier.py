"""The reward hook: one model response against one gold answer -> RewardResult. GRPO's accuracy reward.

reward 1.0 correct, 0.0 wrong or unreadable (no box, empty box, unparseable, over a bound), None when the gold
itself cannot be read (the example gives no learning signal; never 1). `format_ok` is the format signal: the
response holds exactly one box and it is not empty. Pure, bounded by VerifyConfig, safe in threads and processes.
The default config is REWARD_CONFIG: an exact gold (1/3) needs an exact answer, never a decimal of it (the
evaluation default, DEFAULT_CONFIG, accepts `0.3333`; see VerifyConfig.decimal_min_sig_digits).
"""

from __future__ import annotations

from dataclasses import dataclass

from align.verify import VerifyConfig, answer_of, compare_answers, extract, why_unreadable
from align.verify.config import REWARD_CONFIG


@dataclass(frozen=True)
class RewardResult:
    reward: float | None
    format_ok: bool
    extracted: str | None  # the final answer text found in the response (None: none found)
    status: str = ""  # correct | wrong | unreadable | gold_unusable
    reason: str = ""  # why, in words (for logs and the oracle report)


def score(response: str, gold: str, config: VerifyConfig = REWARD_CONFIG) -> RewardResult:
    found = extract(response, config.max_response_chars, config.fallback)
    format_ok = found.boxes == 1 and found.answer is not None
    if found.answer is None:
        gold_problem = why_unreadable(gold, config)
        if gold_problem is not None:
            return RewardResult(None, format_ok, None, "gold_unusable", f"gold unreadable ({gold_problem})")
        return RewardResult(0.0, format_ok, None, "unreadable", "no final answer" if found.boxes == 0 else
                            "empty or unclosed box")
    verdict, why = compare_answers(answer_of(gold, config) or gold, found.answer, config)
    if verdict is None:
        return RewardResult(None, format_ok, found.answer, "gold_unusable", why)
    if verdict:
        return RewardResult(1.0, format_ok, found.answer, "correct", why)
    status = "unreadable" if why.startswith("prediction unreadable") else "wrong"
    return RewardResult(0.0, format_ok, found.answer, status, why)
