"""On-policy preference pairs: the policy's own judged samples become DPO's chosen and rejected arms.

Scripted pairs (a worked solution against a scripted slip) stop teaching once the policy already ranks them: the
tiny SFT checkpoint puts more mass on the chosen arm of every held-out bundled pair (docs/MEASUREMENTS.md, dpo), so
DPO on them can only widen margins the policy already has. A pair built from a mistake the policy actually made,
with the likeliest such mistake as the rejected arm, is one it may still rank wrongly.

Per prompt, from its samples (each judged correct or not against the gold answer):
- rejected: a wrong sample that ended by itself (a cut sample never wrote an end; the chat template would append
  one the policy did not write), the likeliest under the untempered policy (`rejected = "likeliest"`) or the first;
- chosen: a correct sample that ended by itself, the likeliest (`chosen = "likeliest"`), or the dataset's own
  chosen response (`chosen = "reference"`, also the fallback when no sample is correct);
- a prompt with no usable wrong sample keeps the dataset's pair (`when_solved = "offline"`) or is dropped."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

from align.data.schema import PreferencePair


@dataclass(frozen=True)
class OnPolicyConfig:
    """[pairs] table of the onpolicy_pairs stage."""

    samples: int = 4  # responses per prompt
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    rejected: Literal["likeliest", "first"] = "likeliest"
    chosen: Literal["likeliest", "reference"] = "likeliest"
    when_solved: Literal["offline", "drop"] = "offline"  # every sample right: keep the dataset's pair, or drop
    step_check: bool = True  # a right box reached through a false `a op b = c` step is not a correct sample
    max_prompts: int = 0  # the first N pairs of the source; 0 = every pair

    def __post_init__(self):
        if self.samples < 1 or self.max_new_tokens < 1 or self.max_prompts < 0:
            raise ValueError(f"pairs: need samples >= 1, max_new_tokens >= 1, max_prompts >= 0; got {self.samples}, "
                             f"{self.max_new_tokens}, {self.max_prompts}")
        if not self.temperature > 0:
            raise ValueError(f"pairs.temperature must be > 0 (greedy samples are all the same), got {self.temperature}")


@dataclass(frozen=True)
class JudgedSample:
    text: str
    correct: bool
    ended: bool  # finished on the end-of-sequence token (not cut at max_new_tokens)
    model_logprob: float  # sum of the untempered policy's log-probs of its tokens


@dataclass(frozen=True)
class PairChoice:
    pair: PreferencePair | None  # None: dropped
    origin: str  # onpolicy | offline | dropped
    chosen_from_policy: bool
    logprob_margin: float | None  # policy logp(chosen) - logp(rejected) when both arms are its samples


def _pick(samples: list[JudgedSample], how: str) -> JudgedSample:
    return max(samples, key=lambda s: s.model_logprob) if how == "likeliest" else samples[0]


def choose_pair(source: PreferencePair, samples: Sequence[JudgedSample], cfg: OnPolicyConfig) -> PairChoice:
    """The pair one prompt contributes, from its samples in sample order."""
    usable = [s for s in samples if s.ended and s.text.strip()]  # an empty response is no arm
    wrong = [s for s in usable if not s.correct]
    right = [s for s in usable if s.correct]
    if not wrong:
        if cfg.when_solved == "drop":
            return PairChoice(None, "dropped", False, None)
        return PairChoice(source, "offline", False, None)
    rejected = _pick(wrong, cfg.rejected)
    chosen = _pick(right, "likeliest") if right and cfg.chosen == "likeliest" else None
    pair = PreferencePair(source.id, source.prompt, chosen.text if chosen else source.chosen, rejected.text,
                          source.group)
    margin = chosen.model_logprob - rejected.model_logprob if chosen else None
    return PairChoice(pair, "onpolicy", chosen is not None, margin)


def summarise(choices: Sequence[PairChoice], samples: Sequence[JudgedSample]) -> dict:
    """The stage's metrics: how the policy did and where the pairs came from (None where a share has no cases)."""
    margins = [c.logprob_margin for c in choices if c.logprob_margin is not None]
    n = len(samples)
    return {
        "prompts": len(choices), "samples": n,
        "sample_accuracy": sum(s.correct for s in samples) / n if n else None,
        "samples_cut": sum(not s.ended for s in samples),
        "pairs": sum(c.pair is not None for c in choices),
        "pairs_onpolicy": sum(c.origin == "onpolicy" for c in choices),
        "pairs_offline": sum(c.origin == "offline" for c in choices),
        "dropped": sum(c.origin == "dropped" for c in choices),
        "chosen_from_policy": sum(c.chosen_from_policy for c in choices),
        # the share of fully on-policy pairs whose rejected sample the policy found likelier: what DPO must undo
        "policy_prefers_rejected": sum(m < 0 for m in margins) / len(margins) if margins else None,
    }
