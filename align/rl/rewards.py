"""`CompositeReward`: one scalar score per sampled completion, from separate, separately weighted terms
(align.rl.reward_terms: the registry, `[reward] terms`).

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
does a sample the sampler failed on (finish "error"): the batch source drops the whole group.

The formula above is what the table's older keys mean; they are translated to the term list
[verifier, format "boxed", length, truncation] (align.rl.reward_terms.legacy_terms), which computes it bit for bit.
`[reward] terms` replaces them with any list from the registry (the older keys must then keep their defaults)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from align.eval.verifier import RewardResult, score
from align.rl.reward_terms import (RewardTermConfig, Term, TermContext, TermInput, TermValue, build_terms,
                                   legacy_terms, soft_overlong)

__all__ = ["CompositeReward", "RewardConfig", "SampleReward", "soft_overlong"]
LEGACY_DEFAULTS = {"outcome_weight": 1.0, "format_weight": 0.0, "overlong_buffer": 0, "overlong_penalty": 1.0,
                   "truncation_penalty": 0.0, "step_check": False}


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
    # the reward as a list of registry terms (align.rl.reward_terms); absent: the keys above are the list
    terms: tuple[RewardTermConfig, ...] | None = None

    def __post_init__(self):
        for name in ("overlong_buffer", "overlong_penalty", "truncation_penalty", "kl_coef"):
            if getattr(self, name) < 0:
                raise ValueError(f"RewardConfig.{name} must be >= 0, got {getattr(self, name)}")
        if self.terms is not None:
            if not self.terms:
                raise ValueError("RewardConfig.terms is empty: list at least one term, or leave it out")
            moved = [k for k, v in LEGACY_DEFAULTS.items() if getattr(self, k) != v]
            if moved:
                raise ValueError(f"RewardConfig: with `terms`, {moved[0]} is a term's option (verifier weight / "
                                 f"step_check, format, length, truncation), not a key of [reward]")
            keys = [t.key for t in self.terms]
            dup = sorted({k for k in keys if keys.count(k) > 1})
            if dup:
                raise ValueError(f"RewardConfig.terms: label {dup[0]!r} is used twice (give each a distinct label)")

    def term_list(self) -> tuple[RewardTermConfig, ...]:
        if self.terms is not None:
            return self.terms
        return legacy_terms(self.outcome_weight, self.format_weight, self.overlong_buffer, self.overlong_penalty,
                            self.truncation_penalty, self.step_check)


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
    status: str = ""  # the verdict: correct | wrong | unreadable | gold_unusable | error | false_step (code_tests:
    # passed | partial | failed | no_program | program_error | timeout | tests_unusable)
    terms: tuple[tuple[str, float], ...] = ()  # (label, unweighted value) per term, in the list's order
    failures: tuple[str, ...] = ()  # labels of the terms that failed on this sample (rewarded 0)

    @property
    def correct(self) -> bool:
        return self.valid and self.outcome == 1.0


class CompositeReward:
    """Scores decoded completions. `verifier` is align.eval.verifier.score unless a test substitutes another pure
    function with its signature. Model terms (`batch`) are scored by align.rl.reward_models on token batches,
    after the text terms, once their scorers are attached."""

    def __init__(self, cfg: RewardConfig, max_new_tokens: int,
                 verifier: Callable[[str, str], RewardResult] = score):
        self.cfg, self.max_new_tokens, self._verifier = cfg, max_new_tokens, verifier
        self.terms: list[Term] = build_terms(cfg.term_list(), TermContext(max_new_tokens, verifier))
        self.text_terms = [t for t in self.terms if not t.batch]
        self.batch_terms = [t for t in self.terms if t.batch]
        self.labels = [t.key for t in self.terms]
        self.needs_prompt = any(t.cfg.name == "python" for t in self.terms)

    @property
    def verifier(self) -> Callable[[str, str], RewardResult]:
        return self._verifier

    @verifier.setter
    def verifier(self, fn: Callable[[str, str], RewardResult]) -> None:
        """A substituted verifier reaches every term that reads it (verifier, format "boxed")."""
        self._verifier = fn
        for term in self.terms:
            if hasattr(term, "verifier"):
                term.verifier = fn

    def __call__(self, text: str, gold: str, num_tokens: int, finish_reason: str, prompt: str = "",
                 meta: dict | None = None) -> SampleReward:
        return self.score_many([TermInput(text, gold, num_tokens, finish_reason, prompt, meta or {})])[0]

    def score_many(self, items: list[TermInput]) -> list[SampleReward]:
        """Every item's reward; each text term sees all items at once (the sandboxed terms run them in parallel)."""
        live = [x for x in items if x.finish_reason != "error"]
        columns = [term.many(live) for term in self.text_terms]
        by_item = iter(zip(*columns)) if columns else iter([()] * len(live))
        out = []
        for x in items:
            if x.finish_reason == "error":
                out.append(SampleReward(0.0, 0.0, False, 0.0, False, valid=False, status="error"))
            else:
                out.append(self._combine(x, next(by_item)))
        return out

    def _combine(self, x: TermInput, values: tuple[TermValue, ...]) -> SampleReward:
        truncated = x.finish_reason == "length"
        format_ok, overlong, outcome, status, invalid = False, 0.0, None, "", None
        for term, v in zip(self.text_terms, values):
            if v.format_ok is not None and term.cfg.name == "verifier" and not format_ok:
                format_ok = v.format_ok
            if term.cfg.name == "length" and v.value is not None:
                overlong = -v.value
            if v.value is None and invalid is None:
                invalid = v.status
            if term.outcome and outcome is None and v.value is not None:
                outcome, status = v.value, v.status
        if invalid is not None:
            return SampleReward(0.0, 0.0, format_ok, overlong, truncated, valid=False, status=invalid)
        total = None
        for term, v in zip(self.text_terms, values):  # left to right from the first term (module doc)
            weighted = term.weight * v.value
            total = weighted if total is None else total + weighted
        return SampleReward(0.0 if total is None else total, 0.0 if outcome is None else outcome, format_ok,
                            overlong, truncated, status=status,
                            terms=tuple((t.key, v.value) for t, v in zip(self.text_terms, values)),
                            failures=tuple(t.key for t, v in zip(self.text_terms, values) if v.failed))

    def close(self) -> None:
        for term in self.terms:
            term.close()

    @property
    def needs_reference(self) -> bool:
        return self.cfg.kl_coef > 0

    def with_kl(self, reward: SampleReward, seq_kl: float) -> SampleReward:
        """The reward after KL shaping: total - kl_coef * seq_kl, with seq_kl = sum_t (logp - ref_logp)."""
        return replace(reward, total=reward.total - self.cfg.kl_coef * seq_kl, kl=seq_kl)
