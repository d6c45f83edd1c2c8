"""`PpoBatchSource`: GRPO's rollout machinery (align.rl.batch_source: seeded prompts, samples from the Engine,
the weight-version check, stale-window refusal, exact resume) with PPO's per-token credit assignment.

Per rollout, after the samples are drawn and scored by CompositeReward:
    1. old_logprobs: the training policy at the rollout's weights, for every row (the PPO ratio's pi_old and the
       KL's logp); old_values: the critic's values at the same weights (the value clip's anchor, GAE's baseline);
       ref_logprobs: the frozen reference (when [ppo] kl_beta > 0)
    2. per-token rewards (align.rl.ppo.rewards): the score at the last token, minus beta * (logp - ref) on every
       token when kl_in = "reward"
    3. GAE over the completion tokens (align.rl.ppo.gae): token_advantages, returns; advantages whitened over the
       rollout's loss tokens, every rank's together, when [gae] whiten_advantages
    (with a reward model, its score of every row, times [reward] model_weight, joins the score first; with a
    process reward model, its per-step rewards at each step's last token join the per-token rewards,
    align.rl.ppo.process_rewards)
    4. epochs x num_minibatches windows (align.rl.assembly.plan_windows); the first `critic_warmup_rollouts`
       rollouts' micro-batches carry `critic_only` (the module then trains the critic alone)
Every training row is scored by pi_old before the first step when the KL is in the reward (the advantages need
the policy's log-probs of every row) or when the rollout trains in more than one window; with a single window
(one minibatch, one epoch) and no KL in the reward the window trains on the weights that sampled it, so it carries
GRPO's `old_from_forward` and pi_old is its own training forward (one scoring pass fewer per rollout; the logged
`rollout/kl` then reads the sampler's log-probs of the same weights). The critic's values are always scored here:
GAE needs them. With `[gae] negative_scale` < 1 the (whitened) negative advantages are scaled down (GRPO's
`[advantage] negative_scale`; 0 reinforces only the tokens that did better than the critic expected).
The stale checks are GRPO's: a sample whose weight version is not the policy's raises (the engine was not
updated: never trained on), and a window that lags the policy by more than `shape.staleness_bound` steps is
refused with the rest of its rollout when `shape.on_stale = "refuse"`.

With `[environment]` (multi-turn episodes, align.rl.environment: GRPO's episode runner) the per-token rewards and
GAE run over the policy's own tokens (`policy_mask`): the environment's observation tokens take no KL, no process
reward and no advantage, and a turn's last token bootstraps from the critic's value at the next turn
(align.rl.ppo.gae `policy_columns`); the loss mask already keeps them out of the policy and value losses."""

from __future__ import annotations

import time
from typing import Callable

import torch

from align.rl.ppo.gae import (GaeConfig, gae, gather_columns, policy_columns, scale_negatives, scatter_columns,
                              whiten)
from align.rl.ppo.rewards import token_rewards
from align.rl.ppo.stage_config import PpoConfig
from align.rl.advantages import AdvantageConfig
from align.rl.assembly import assemble, plan_windows, row_lengths, select_rows, window_seed
from align.rl.batch_source import GrpoBatchSource, PromptSet, Scorer, attach_stats
from align.rl.curriculum import PromptCurriculum
from align.rl.environment import EpisodeRunner
from align.rl.rewards import CompositeReward
from align.rl.stage_config import DynamicSamplingConfig, RolloutShape
from align.rl.zero_rows import micro_count
from align.rollout.protocol import RolloutClient
from align.utils.dist import all_reduce_max, all_reduce_sum



class PpoBatchSource(GrpoBatchSource):
    def __init__(self, prompts: PromptSet, client: RolloutClient, decode: Callable[[list[int]], str],
                 reward: CompositeReward, curriculum: PromptCurriculum, shape: RolloutShape,
                 dynamic: DynamicSamplingConfig, ppo: PpoConfig, gae_cfg: GaeConfig, *, seed: int, eos_id: int,
                 policy_version: Callable[[], int], old_scorer: Scorer | None, value_scorer: Scorer,
                 ref_scorer: Scorer | None = None, world_size: int = 1,
                 reward_model: Callable[[dict], torch.Tensor] | None = None, reward_model_weight: float = 1.0,
                 process_reward: Callable[[dict], torch.Tensor] | None = None, episodes: EpisodeRunner | None = None):
        if reward.needs_reference:
            raise ValueError("PpoBatchSource: [reward] kl_coef must be 0; PPO's KL is [ppo] kl_beta")
        if ppo.kl_beta > 0 and ref_scorer is None:
            raise ValueError("PpoBatchSource: [ppo] kl_beta > 0 needs ref_scorer")
        super().__init__(prompts, client, decode, reward, curriculum, shape, dynamic, AdvantageConfig(), seed=seed,
                         eos_id=eos_id, policy_version=policy_version, old_scorer=old_scorer, ref_scorer=ref_scorer,
                         world_size=world_size, episodes=episodes)
        self.ppo, self.gae_cfg, self.value_scorer, self.world_size = ppo, gae_cfg, value_scorer, world_size
        self.reward_model, self.reward_model_weight = reward_model, reward_model_weight
        self.process_reward = process_reward  # (N, C) per-token rewards of a PRM (align.rl.ppo.process_rewards)

    def _rollout(self) -> list[list[dict]]:
        t0 = time.perf_counter()
        groups, counts = self._sample_groups()
        gen_s = time.perf_counter() - t0
        batch = assemble(groups, torch.zeros(len(groups), self.shape.samples), self.shape.truncated)
        del batch["advantages"]  # GRPO's sequence advantages; PPO's are per token (below)
        t1 = time.perf_counter()
        comp, loss_mask = batch["completion_mask"], batch["loss_mask"]
        shape = self.shape
        plan = plan_windows(row_lengths(batch), shape.num_minibatches, shape.micro_batch_size,
                            window_seed(self.seed, self.rollouts), shape.epochs)
        beta = self.ppo.kl_beta if self.ppo.kl_in == "reward" else 0.0
        # one window trained on the weights that sampled it, and no KL in the reward: pi_old is the training
        # forward itself (GRPO's `old_from_forward`), so the policy's scoring pass is not needed
        from_forward = self.old_scorer is not None and len(plan) == 1 and beta == 0.0
        # the policy's, the critic's and the reference's forwards are collectives under FSDP2: every rank scores in
        # the same number of passes, however many rows it holds (dynamic sampling can leave ranks uneven)
        passes = None if self.world_size == 1 else int(
            all_reduce_max([micro_count(comp.shape[0], shape.micro_batch_size)])[0])
        if self.old_scorer is not None and not from_forward:  # else pi_old is the sampler's log-probs
            batch["old_logprobs"] = self._score(batch, self.old_scorer, passes=passes)  # (old_logprobs = "rollout")
        batch["old_values"] = self._score(batch, self.value_scorer, passes=passes)
        ref = None
        if self.ref_scorer is not None:
            ref = batch["ref_logprobs"] = self._score(batch, self.ref_scorer, passes=passes)
        rm_sum = 0.0
        if self.reward_model is not None:  # the verifier's terms + weight x the reward model's score
            rm = self._score_rows(batch, self.reward_model)
            batch["rewards"] = batch["rewards"] + self.reward_model_weight * rm
            rm_sum = float(rm.sum())
        process = None
        if self.process_reward is not None:  # the PRM's reward at each step's last token, beside the outcome's
            process = self._score(batch, self.process_reward)
        if "policy_mask" in batch:  # multi-turn: the policy's tokens only, observations skipped (module doc)
            own = comp * batch["policy_mask"]
            order = policy_columns(own)
            cols = lambda x: None if x is None else gather_columns(x, order)  # noqa: E731
            rewards, kl = token_rewards(batch["rewards"], cols(own), cols(batch["old_logprobs"]), cols(ref), beta)
            rewards = rewards + cols(process) * cols(own) if process is not None else rewards
            adv, returns = gae(rewards.double(), cols(batch["old_values"]).double(), cols(own), self.gae_cfg.gamma,
                               self.gae_cfg.lam)
            adv, returns, kl = scatter_columns(adv, order), scatter_columns(returns, order), scatter_columns(kl, order)
            process = process * own if process is not None else None
        else:
            own = comp
            rewards, kl = token_rewards(batch["rewards"], comp, batch["old_logprobs"], ref, beta)
            rewards = rewards + process if process is not None else rewards
            adv, returns = gae(rewards.double(), batch["old_values"].double(), comp, self.gae_cfg.gamma,
                               self.gae_cfg.lam)
        if self.gae_cfg.whiten_advantages:  # over every rank's loss tokens: one scale for the whole step
            reduce = all_reduce_sum if self.world_size > 1 else None
            n = float(loss_mask.sum()) if reduce is None else float(reduce([float(loss_mask.sum())])[0])
            if n >= 2:
                adv = whiten(adv, loss_mask, reduce=reduce)
        adv = scale_negatives(adv, self.gae_cfg.negative_scale)
        batch["token_advantages"], batch["returns"] = adv.float(), returns.float()
        critic_only = self.rollouts < self.ppo.critic_warmup_rollouts
        flags = {"critic_only": critic_only, **({"old_from_forward": True} if from_forward else {})}
        windows = [[{**select_rows(batch, rows), **flags} for rows in window] for window in plan]
        stats = {**counts, "rollout/gen_s": gen_s, "rollout/score_s": time.perf_counter() - t1,
                 "rollout/refused_windows": float(self.refused), "rollout/ranks": 1.0,
                 "rollout/kl_sum": float(kl.sum()), "rollout/kl_tokens": float(own.sum()),
                 "rollout/critic_only": float(critic_only), "rollout/rm_score_sum": rm_sum,
                 "rollout/rm_rows": float(comp.shape[0]) if self.reward_model is not None else 0.0,
                 "rollout/process_reward_sum": float(process.sum()) if process is not None else 0.0,
                 "rollout/process_steps": float((process != 0).sum()) if process is not None else 0.0}
        self.rollouts += 1
        self.refused = 0
        attach_stats(windows, stats)
        return windows

    def _score_rows(self, batch: dict, scorer: Callable[[dict], torch.Tensor]) -> torch.Tensor:
        """(N,) per-row scores, in micro-batches of the rollout's size."""
        out = torch.zeros(batch["completion_ids"].shape[0])
        for rows in torch.arange(out.shape[0]).split(self.shape.micro_batch_size):
            out[rows] = scorer(select_rows(batch, rows)).float().cpu()
        return out
