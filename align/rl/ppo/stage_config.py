"""Typed tables of the PPO stage: `[ppo]` (the KL to the reference, the critic warmup and extra value-only passes,
the ratio tripwire) and the
stage config that composes every component's own table (the rollout's tables are GRPO's: align.rl.stage_config)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from align.reward.rm_module import RmHeadConfig
from align.rl.ppo.gae import GaeConfig
from align.rl.ppo.loss import PpoLossConfig
from align.rl.rewards import RewardConfig
from align.rl.stage_config import DynamicSamplingConfig, RolloutStageConfig
from align.train.optim import OptimizerConfig


@dataclass(frozen=True)
class PpoConfig:
    """[ppo] table."""

    kl_beta: float = 0.05  # weight of the KL to the frozen reference (0: no reference model is loaded)
    kl_in: Literal["reward", "loss"] = "reward"  # reward: -beta * (logp - ref) on every token's reward (TRL PPO);
    # loss: + beta * k3(logp, ref) per token in the loss (as GRPO's kl_beta)
    critic_warmup_rollouts: int = 0  # the first N rollouts train the critic only (the policy does not move)
    critic_extra_epochs: int = 0  # after every applied step, N more value-only passes over the step's micro-batches
    # (the policy frozen), each one critic optimizer step: the critic fits the rollout's returns before the next
    ratio_skip_abs_log: float | None = 1.0  # a step whose mean |log r| over its loss tokens exceeds this is not
    # applied (policy nor critic) and counts as a skipped step (the Trainer's skip caps: HALT 81); None: off

    def __post_init__(self):
        if self.kl_beta < 0:
            raise ValueError(f"PpoConfig.kl_beta must be >= 0, got {self.kl_beta}")
        if self.kl_in not in ("reward", "loss"):
            raise ValueError(f"PpoConfig.kl_in must be 'reward' or 'loss', got {self.kl_in!r}")
        if self.critic_warmup_rollouts < 0:
            raise ValueError(f"PpoConfig.critic_warmup_rollouts must be >= 0, got {self.critic_warmup_rollouts}")
        if self.critic_extra_epochs < 0:
            raise ValueError(f"PpoConfig.critic_extra_epochs must be >= 0, got {self.critic_extra_epochs}")
        if self.ratio_skip_abs_log is not None and not self.ratio_skip_abs_log > 0:
            raise ValueError(f"PpoConfig.ratio_skip_abs_log must be > 0 or absent, got {self.ratio_skip_abs_log}")


@dataclass(frozen=True)
class PpoRewardConfig(RewardConfig):
    """[reward] table of PPO: GRPO's terms (align.rl.rewards, align.rl.reward_terms: a `reward_model` or
    `process_reward_model` term works here too), or the older keys plus an optional reward model's score."""

    model: str = ""  # a reward model under <runs> (the `rm_checkpoint` rung: "rm_checkpoint/final"); "": none
    model_weight: float = 1.0  # total = CompositeReward's total + model_weight * the model's score
    # a process reward model under <runs> (MistralForProcessReward, align.reward.rm_process); "": none. Its reward
    # process_weight * (2 sigmoid(logit) - 1) at the last token of every step (line) joins the per-token rewards
    process_model: str = ""
    process_weight: float = 1.0

    def __post_init__(self):
        super().__post_init__()
        if self.terms is not None and (self.model or self.process_model):
            raise ValueError("PpoRewardConfig: with `terms`, give the reward model as a `reward_model` term (a "
                             "sequence reward; `process_model` is PPO's per-token PRM reward, the older spelling)")
        if self.model and not self.model_weight > 0:
            raise ValueError(f"PpoRewardConfig.model_weight must be > 0 with a reward model, got {self.model_weight}")
        if self.process_model and not self.process_weight > 0:
            raise ValueError(f"PpoRewardConfig.process_weight must be > 0 with a process reward model, got "
                             f"{self.process_weight}")


@dataclass(frozen=True, kw_only=True)
class PpoStageConfig(RolloutStageConfig):
    """GRPO's rollout tables (align.rl.stage_config.RolloutStageConfig) with PPO's reward, objective and critic."""

    dynamic_sampling: DynamicSamplingConfig = field(default_factory=lambda: DynamicSamplingConfig(enabled=False))
    reward: PpoRewardConfig = field(default_factory=PpoRewardConfig)
    ppo: PpoConfig = field(default_factory=PpoConfig)
    gae: GaeConfig = field(default_factory=GaeConfig)
    loss: PpoLossConfig = field(default_factory=PpoLossConfig)
    critic_optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)  # the critic's (constant lr)
    critic_head: RmHeadConfig = field(default_factory=RmHeadConfig)  # the value head's lr = critic lr x lr_scale

    def __post_init__(self):
        if self.reward.kl_coef > 0:
            raise ValueError("PpoStageConfig: [reward] kl_coef must be 0 in PPO: the KL to the reference is "
                             "[ppo] kl_beta (per token, in the reward or in the loss)")
