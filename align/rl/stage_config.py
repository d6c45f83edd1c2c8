"""Typed tables of the GRPO stage that are not a single component's: the rollout's shape (`RolloutShape`), dynamic
sampling, and the stage config (`GrpoStageConfig`) that composes every component's own table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from align.lora.adapters import LoraConfig
from align.profile import CommonConfig
from align.rl.advantages import AdvantageConfig
from align.rl.curriculum import CurriculumConfig
from align.rl.grpo_loss import GrpoLossConfig
from align.rl.rewards import RewardConfig
from align.rl.step_credit import StepCreditConfig
from align.eval.inloop_config import InLoopEvalConfig
from align.eval.canary import CanaryConfig
from align.rl.tripwires import HealthConfig
from align.rollout.protocol import RolloutConfig
from align.tokenizer import TokenizerConfig
from align.train.moe_module import MoeAuxConfig
from align.train.optim import OptimizerConfig
from align.train.parallel import ParallelConfig
from align.train.schedulers import SchedulerConfig
from align.train.trainer import TrainerConfig


@dataclass(frozen=True)
class RolloutShape:
    """[shape] table: P prompts x G samples per rollout, and how a rollout becomes optimizer steps."""

    prompts: int = 8  # P per rollout, summed over ranks (each rank samples P / world_size)
    samples: int = 8  # G completions per prompt
    temperature: float = 1.0  # sampling temperature; training log-probs use the same (top-k / top-p are refused:
    # the trainer cannot replay a truncated support, seed 003 2.7)
    max_new_tokens: int = 64
    num_minibatches: int = 1  # optimizer steps per pass over a rollout; > 1 makes the clip bind
    epochs: int = 1  # passes over each rollout (TRL num_iterations); optimizer steps = epochs x num_minibatches
    micro_batch_size: int = 16  # sequences per forward / backward
    old_logprobs: Literal["recompute", "rollout"] = "recompute"  # recompute: the training model scores the rollout
    # at its weights (exact rho); rollout: trust the sampler's log-probs as pi_old (rho == 1 by construction)
    max_staleness: int | None = None  # optimizer steps a rollout may lag the policy; None: steps_per_rollout - 1
    on_stale: Literal["correct", "refuse"] = "refuse"  # a staler window: trained (ratio and rho correct it) or dropped
    truncated: Literal["mask", "keep"] = "mask"  # a completion cut at max_new_tokens: out of the loss, or kept

    def __post_init__(self):
        problems = []
        for name in ("prompts", "samples", "max_new_tokens", "num_minibatches", "epochs", "micro_batch_size"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.temperature > 0:
            problems.append(f"temperature must be > 0 (greedy samples have no spread), got {self.temperature}")
        if self.samples < 2:
            problems.append(f"samples must be >= 2: a group of one has no relative advantage, got {self.samples}")
        if self.max_staleness is not None and self.max_staleness < 0:
            problems.append(f"max_staleness must be >= 0 or absent, got {self.max_staleness}")
        if problems:
            raise ValueError("RolloutShape: " + "; ".join(problems))

    @property
    def steps_per_rollout(self) -> int:
        return self.epochs * self.num_minibatches

    @property
    def staleness_bound(self) -> int:
        return self.steps_per_rollout - 1 if self.max_staleness is None else self.max_staleness

    def check_world(self, world_size: int) -> int:
        """Prompts per rank; refuses a shape that does not split evenly (every rank must take the same steps)."""
        if self.prompts % world_size:
            raise ValueError(f"shape.prompts = {self.prompts} does not split over {world_size} ranks")
        local = self.prompts // world_size
        if (local * self.samples) % self.num_minibatches:
            raise ValueError(f"{local} prompts x {self.samples} samples per rank do not split into "
                             f"shape.num_minibatches = {self.num_minibatches} equal optimizer steps")
        return local


@dataclass(frozen=True)
class DynamicSamplingConfig:
    """[dynamic_sampling] table: groups whose rewards are all equal carry no gradient (every advantage is 0)."""

    enabled: bool = True  # drop zero-variance groups and top up with fresh prompts
    max_rounds: int = 3  # top-up rounds after the first (the retry budget); short after it: fill with dropped groups
    # Also drop groups the policy solves more often than this (1.0: only all-correct ones). Why: a prompt whose
    # greedy answer is already right mostly teaches the sampler to agree with it (sampled pass@1 rises, greedy
    # accuracy does not); the prompts solved at most half the time are those whose likeliest answer may be wrong.
    max_pass_rate: float = 1.0

    def __post_init__(self):
        if self.max_rounds < 0:
            raise ValueError(f"DynamicSamplingConfig.max_rounds must be >= 0, got {self.max_rounds}")
        if not 0.0 < self.max_pass_rate <= 1.0:
            raise ValueError(f"DynamicSamplingConfig.max_pass_rate must be in (0, 1], got {self.max_pass_rate}")


@dataclass(frozen=True)
class EnvironmentConfig:
    """[environment] table: multi-turn rollouts (align.rl.environment); absent: one prompt, one completion."""

    name: Literal["calculator"] = "calculator"
    max_turns: int = 4  # observations per episode
    max_tokens: int = 0  # completion tokens per episode, the policy's and the observations'; 0: shape.max_new_tokens
    # How an observation enters the conversation (align.rl.env_chat): "tool_turn" = a tool-result turn of the
    # tokenizer's chat template after the policy's end-of-turn token (Qwen 2.5 / 3, Llama 3.x templates; refused for
    # a format without a tool role); "inline" = plain tokens inside the assistant's reply after a line holding the
    # call (the only way for Mistral v0.3's [INST] format, which has no tool role); "auto" = "tool_turn" where the
    # template renders one, else "inline"
    observation: Literal["auto", "tool_turn", "inline"] = "auto"

    def __post_init__(self):
        if self.max_turns < 0 or self.max_tokens < 0:
            raise ValueError(f"EnvironmentConfig: max_turns and max_tokens must be >= 0, got {self.max_turns}, "
                             f"{self.max_tokens}")


@dataclass(frozen=True)
class GrpoDataConfig:
    """[data] table: inputs relative to <runs>, and the held-out evaluation."""

    start: str = "dpo_checkpoint/final"  # the policy's initial weights (and the reference)
    prompts: str = "shards/prompts/out"
    eval: str = "shards/eval/out"  # held-out prompts: greedy accuracy of the start and of the result
    eval_rows: int = 0  # evaluate the first N rows (0: all)
    eval_max_new_tokens: int = 64  # greedy decode limit of the held-out evaluation (as golden_eval's)
    # Also greedy-evaluate the first N RL prompts (the ones the stage trains on) before and after: the receipt's
    # `trained_*` keys, beside the held-out gain (the gap is what the policy fitted to its prompts); 0: off
    train_eval_rows: int = 0
    model_dtype: Literal["float32", "bfloat16"] = "float32"  # the trained weights (bf16: with adamw8bit, 7B-class)
    engine_dtype: Literal["float32", "bfloat16"] = "float32"  # the sampler's copy of the weights
    threads: int = 0  # torch CPU threads; 0: every core


@dataclass(frozen=True, kw_only=True)
class RolloutStageConfig(CommonConfig):
    """The tables every RL stage shares (GRPO, and PPO on its machinery): the policy's training, its prompts and
    rollouts, the reward, health, canary and in-loop evaluation, the policy's optimizer and schedule, LoRA."""

    train: TrainerConfig
    data: GrpoDataConfig = field(default_factory=GrpoDataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    shape: RolloutShape = field(default_factory=RolloutShape)
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    canary: CanaryConfig = field(default_factory=CanaryConfig)
    inloop_eval: InLoopEvalConfig = field(default_factory=InLoopEvalConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)  # the policy's
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)  # the policy's
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    lora: LoraConfig | None = None  # [lora] (align.lora.stage): adapters train, the sampler follows by
    # [lora] engine_sync; absent: full fine-tuning
    environment: EnvironmentConfig | None = None  # [environment]: multi-turn episodes; absent: single turn


@dataclass(frozen=True, kw_only=True)
class GrpoStageConfig(RolloutStageConfig):
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    step_credit: StepCreditConfig = field(default_factory=StepCreditConfig)  # [step_credit]: off unless weight > 0
    loss: GrpoLossConfig = field(default_factory=GrpoLossConfig)
    moe_aux: MoeAuxConfig = field(default_factory=MoeAuxConfig)  # [moe_aux]: MoE policies only (default: none)
