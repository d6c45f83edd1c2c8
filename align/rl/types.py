"""Shared records of the GRPO path: a scored sample, a prompt's group, and the layout of a training micro-batch.

A GRPO micro-batch is a dict of CPU tensors (docs/CONTRACTS.md "Data" style), N sequences:
    input_ids         (N, T) int64   prompt + completion, right-padded with 0 (causal attention needs no mask)
    completion_start  (N,)   int64   prompt length: completion token j sits at position start + j
    completion_ids    (N, C) int64   the sampled tokens, right-padded with 0
    completion_mask   (N, C) float32 1 on sampled tokens (statistics: entropy, ratio, lengths)
    loss_mask         (N, C) float32 completion_mask, zeroed where the loss must not look (a masked truncation)
    policy_mask       (N, C) float32 (multi-turn only) 1 on the policy's own tokens, 0 on an environment's observation
                                     tokens and padding: the per-token statistics (entropy, rho) cover only these
    rollout_logprobs  (N, C) float32 the sampler's log-probs (behaviour policy, at the sampling temperature)
    old_logprobs      (N, C) float32 the training model's log-probs at the rollout's weights (== rollout_logprobs
                                     when the stage does not recompute them; unused when old_from_forward)
    old_from_forward  bool (optional) the batch trains on the weights that sampled it: pi_old is its own forward
    ref_logprobs      (N, C) float32 reference model log-probs (only when the loss has a KL term)
    advantages        (N,)   float32
    step_advantages   (N, C) float32 (optional) step credit on equation results (align.rl.step_credit), added to
                                     the row's advantage on those tokens
    rewards, correct, truncated (N,) float32   the reward, 1/0 outcome, 1/0 cut at max_new_tokens
    weight_version    (N,)   int64   the sampler's weight version that generated each row
    prompt_row        (N,)   int64   the prompt's row in its shard set
and one non-tensor entry, `stats` (dict str -> float), on the first micro-batch of each optimizer step only: the
rollout's own numbers (generation time, dynamic-sampling counts), summed by the Trainer like any statistic."""

from __future__ import annotations

from dataclasses import dataclass

from align.rl.rewards import SampleReward

TOKEN_KEYS = ("completion_ids", "completion_mask", "loss_mask", "rollout_logprobs", "old_logprobs", "ref_logprobs",
              "old_values", "returns", "token_advantages", "step_advantages", "policy_mask")
# old_values .. token_advantages: PPO's per-token critic terms (align.rl.ppo.batch_source: the critic's values at the
# rollout, GAE's returns and advantages, (N, C) float32); step_advantages: GRPO's step credit (align.rl.step_credit),
# added to `advantages`; policy_mask: multi-turn only (the layout above)
ROW_KEYS = ("completion_start", "advantages", "rewards", "correct", "truncated", "weight_version", "prompt_row")


@dataclass(frozen=True)
class ScoredSample:
    """One completion with its reward; everything the batch needs from the sampler."""

    prompt_row: int
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    rollout_logprobs: tuple[float, ...]
    finish_reason: str
    weight_version: int
    reward: SampleReward
    policy_mask: tuple[float, ...] | None = None  # multi-turn (align.rl.environment): 0 on the environment's
    # observation tokens, which never train; None: every completion token is the policy's
    turns: int = 0  # multi-turn: the environment's observations in this sample (a tool's answers)


@dataclass(frozen=True)
class Group:
    """The G samples of one prompt."""

    prompt_row: int
    samples: tuple[ScoredSample, ...]

    @property
    def valid(self) -> bool:
        return all(s.reward.valid for s in self.samples)

    @property
    def totals(self) -> list[float]:
        return [s.reward.total for s in self.samples]

    @property
    def all_correct(self) -> bool:
        return all(s.reward.correct for s in self.samples)

    @property
    def pass_rate(self) -> float:
        """Share of the G samples the verifier judged correct."""
        return sum(bool(s.reward.correct) for s in self.samples) / len(self.samples)
