"""`CompositeReward`: one scalar score per sampled completion, from separate, separately weighted terms.

Rewards live outside the loss (seed 000, "Reward composition vs. loss"): they can be reweighted, or a curriculum can
change them, without recomputing a log-prob; the loss only ever sees the advantages computed from them.

    total = outcome_weight * outcome                       1 correct / 0 wrong (align.eval.verifier.score)
          + format_weight * (format_ok ? 1 : 0)            one non-empty box (the verifier's format signal)
          - overlong(n)                                    DAPO's soft overlong punishment, n = completion tokens:
                0 for n <= L - buffer, rising linearly to overlong_penalty at n = L (L = max_new_tokens)
          - truncation_penalty * truncated                 a completion cut at max_new_tokens (finish "length")
          - kl_coef * sum_t (logp_t - ref_logp_t)           optional KL shaping (k1 estimate of the sequence KL),
                                                           applied by `with_kl` once reference log-probs exist
With `step_check`, the outcome is withheld (0, status "false_step") from a completion that writes a false equation
(align.verify.step_check): a right box reached through wrong arithmetic is not reinforced.
A sample whose gold answer the verifier cannot read has `valid = False` (no learning signal; never rewarded), and so
does a sample the sampler failed on (finish "error"): the batch source drops the whole group."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from align.eval.verifier import RewardResult, score
from align.verify.step_check import false_steps


@dataclass(frozen=True)
class RewardConfig:
    """[reward] table."""

    outcome_weight: float = 1.0
    format_weight: float = 0.0  # a bonus for a well-formed answer; 0 keeps the reward the pure outcome
    overlong_buffer: int = 0  # tokens before max_new_tokens where the soft penalty ramps up (0: off)
    overlong_penalty: float = 1.0  # the soft penalty at max_new_tokens
    truncation_penalty: float = 0.0  # flat penalty for a completion cut at max_new_tokens
    kl_coef: float = 0.0  # KL shaping of the reward (needs the reference model)
    step_check: bool = False  # outcome 0 for a completion with a false `a op b = c` step (align.verify.step_check)

    def __post_init__(self):
        for name in ("overlong_buffer", "overlong_penalty", "truncation_penalty", "kl_coef"):
            if getattr(self, name) < 0:
                raise ValueError(f"RewardConfig.{name} must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class SampleReward:
    """The terms of one completion's reward; `total` is what advantages are computed from."""

    total: float
    outcome: float
    format_ok: bool
    overlong: float  # the soft penalty subtracted (>= 0)
    truncated: bool
    kl: float = 0.0  # sum_t (logp - ref_logp) when shaping is on
    valid: bool = True
    status: str = ""  # the verdict: correct | wrong | unreadable | gold_unusable | error | false_step

    @property
    def correct(self) -> bool:
        return self.valid and self.outcome == 1.0


def soft_overlong(num_tokens: int, max_new_tokens: int, buffer: int, penalty: float) -> float:
    """DAPO's soft overlong punishment: 0 up to L - buffer, then linear to `penalty` at L (and beyond)."""
    if buffer <= 0:
        return 0.0
    over = num_tokens - (max_new_tokens - buffer)
    return 0.0 if over <= 0 else penalty * min(1.0, over / buffer)


class CompositeReward:
    """Scores decoded completions against gold answers. `verifier` is align.eval.verifier.score unless a test
    substitutes another pure function with its signature."""

    def __init__(self, cfg: RewardConfig, max_new_tokens: int,
                 verifier: Callable[[str, str], RewardResult] = score):
        self.cfg, self.max_new_tokens, self.verifier = cfg, max_new_tokens, verifier

    def __call__(self, text: str, gold: str, num_tokens: int, finish_reason: str) -> SampleReward:
        cfg = self.cfg
        if finish_reason == "error":
            return SampleReward(0.0, 0.0, False, 0.0, False, valid=False, status="error")
        verdict = self.verifier(text, gold)
        truncated = finish_reason == "length"
        overlong = soft_overlong(num_tokens, self.max_new_tokens, cfg.overlong_buffer, cfg.overlong_penalty)
        if verdict.reward is None:
            return SampleReward(0.0, 0.0, verdict.format_ok, overlong, truncated, valid=False, status=verdict.status)
        outcome, status = verdict.reward, verdict.status
        if cfg.step_check and outcome and false_steps(text):
            outcome, status = 0.0, "false_step"
        total = (cfg.outcome_weight * outcome + cfg.format_weight * float(verdict.format_ok) - overlong
                 - cfg.truncation_penalty * float(truncated))
        return SampleReward(total, outcome, verdict.format_ok, overlong, truncated, status=status)

    @property
    def needs_reference(self) -> bool:
        return self.cfg.kl_coef > 0

    def with_kl(self, reward: SampleReward, seq_kl: float) -> SampleReward:
        """The reward after KL shaping: total - kl_coef * seq_kl, with seq_kl = sum_t (logp - ref_logp)."""
        return replace(reward, total=reward.total - self.cfg.kl_coef * seq_kl, kl=seq_kl)
