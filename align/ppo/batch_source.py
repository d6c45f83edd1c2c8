"""`PpoBatchSource`: GRPO's rollout machinery (align.rl.batch_source: seeded prompts, samples from the Engine,
the weight-version check, stale-window refusal, exact resume) with PPO's per-token credit assignment.

Per rollout, after the samples are drawn and scored by CompositeReward:
    1. old_logprobs: the training policy at the rollout's weights, for every row (the PPO ratio's pi_old and the
       KL's logp); old_values: the critic's values at the same weights (the value clip's anchor, GAE's baseline);
       ref_logprobs: the frozen reference (when [ppo] kl_beta > 0)
    2. per-token rewards (align.ppo.rewards): the score at the last token, minus beta * (logp - ref) on every
       token when kl_in = "reward"
    3. GAE over the completion tokens (align.ppo.gae): token_advantages, returns; advantages whitened over the
       rollout's loss tokens when [gae] whiten_advantages
    (with a reward model, its score of every row, times [reward] model_weight, joins the score first)
    4. epochs x num_minibatches windows (align.rl.assembly.plan_windows); the first `critic_warmup_rollouts`
       rollouts' micro-batches carry `critic_only` (the module then trains the critic alone)
Every training row is scored before the first step (no `old_from_forward`): the advantages need pi_old of every
row when the KL is in the reward, and the critic's values come from the same pass.
The stale checks are GRPO's: a sample whose weight version is not the policy's raises (the engine was not
updated: never trained on), and a window that lags the policy by more than `shape.staleness_bound` steps is
refused with the rest of its rollout when `shape.on_stale = "refuse"`."""

from __future__ import annotations

import time
from typing import Callable

import torch

from align.ppo.gae import GaeConfig, gae, whiten
from align.ppo.rewards import token_rewards
from align.ppo.stage_config import PpoConfig
from align.rl.advantages import AdvantageConfig
from align.rl.assembly import assemble, plan_windows, row_lengths, select_rows, window_seed
from align.rl.batch_source import GrpoBatchSource, PromptSet, Scorer, attach_stats
from align.rl.curriculum import PromptCurriculum
from align.rl.rewards import CompositeReward
from align.rl.stage_config import DynamicSamplingConfig, RolloutShape
from align.rollout.protocol import RolloutClient



class PpoBatchSource(GrpoBatchSource):
    def __init__(self, prompts: PromptSet, client: RolloutClient, decode: Callable[[list[int]], str],
                 reward: CompositeReward, curriculum: PromptCurriculum, shape: RolloutShape,
                 dynamic: DynamicSamplingConfig, ppo: PpoConfig, gae_cfg: GaeConfig, *, seed: int, eos_id: int,
                 policy_version: Callable[[], int], old_scorer: Scorer | None, value_scorer: Scorer,
                 ref_scorer: Scorer | None = None, world_size: int = 1,
                 reward_model: Callable[[dict], torch.Tensor] | None = None, reward_model_weight: float = 1.0):
        if reward.needs_reference:
            raise ValueError("PpoBatchSource: [reward] kl_coef must be 0; PPO's KL is [ppo] kl_beta")
        if ppo.kl_beta > 0 and ref_scorer is None:
            raise ValueError("PpoBatchSource: [ppo] kl_beta > 0 needs ref_scorer")
        super().__init__(prompts, client, decode, reward, curriculum, shape, dynamic, AdvantageConfig(), seed=seed,
                         eos_id=eos_id, policy_version=policy_version, old_scorer=old_scorer, ref_scorer=ref_scorer,
                         world_size=world_size)
        self.ppo, self.gae_cfg, self.value_scorer = ppo, gae_cfg, value_scorer
        self.reward_model, self.reward_model_weight = reward_model, reward_model_weight

    def _rollout(self) -> list[list[dict]]:
        t0 = time.perf_counter()
        groups, counts = self._sample_groups()
        gen_s = time.perf_counter() - t0
        batch = assemble(groups, torch.zeros(len(groups), self.shape.samples), self.shape.truncated)
        del batch["advantages"]  # GRPO's sequence advantages; PPO's are per token (below)
        t1 = time.perf_counter()
        comp, loss_mask = batch["completion_mask"], batch["loss_mask"]
        if self.old_scorer is not None:  # else pi_old is the sampler's log-probs (shape.old_logprobs = "rollout")
            batch["old_logprobs"] = self._score(batch, self.old_scorer)
        batch["old_values"] = self._score(batch, self.value_scorer)
        ref = None
        if self.ref_scorer is not None:
            ref = batch["ref_logprobs"] = self._score(batch, self.ref_scorer)
        rm_sum = 0.0
        if self.reward_model is not None:  # the verifier's terms + weight x the reward model's score
            rm = self._score_rows(batch, self.reward_model)
            batch["rewards"] = batch["rewards"] + self.reward_model_weight * rm
            rm_sum = float(rm.sum())
        beta = self.ppo.kl_beta if self.ppo.kl_in == "reward" else 0.0
        rewards, kl = token_rewards(batch["rewards"], comp, batch["old_logprobs"], ref, beta)
        adv, returns = gae(rewards.double(), batch["old_values"].double(), comp, self.gae_cfg.gamma,
                           self.gae_cfg.lam)
        if self.gae_cfg.whiten_advantages and loss_mask.sum() >= 2:
            adv = whiten(adv, loss_mask)
        batch["token_advantages"], batch["returns"] = adv.float(), returns.float()
        shape = self.shape
        plan = plan_windows(row_lengths(batch), shape.num_minibatches, shape.micro_batch_size,
                            window_seed(self.seed, self.rollouts), shape.epochs)
        critic_only = self.rollouts < self.ppo.critic_warmup_rollouts
        windows = [[{**select_rows(batch, rows), "critic_only": critic_only} for rows in window] for window in plan]
        stats = {**counts, "rollout/gen_s": gen_s, "rollout/score_s": time.perf_counter() - t1,
                 "rollout/refused_windows": float(self.refused), "rollout/ranks": 1.0,
                 "rollout/kl_sum": float(kl.sum()), "rollout/kl_tokens": float(comp.sum()),
                 "rollout/critic_only": float(critic_only), "rollout/rm_score_sum": rm_sum,
                 "rollout/rm_rows": float(comp.shape[0]) if self.reward_model is not None else 0.0}
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
