"""`PpoTrainModule`: PPO with a separate critic on the TrainModule seam. The formulas are align.rl.ppo.loss (clipped
surrogate, clipped value loss, entropy bonus) and align.rl.ppo.gae (in the batch source); this file wires them to the
policy, the critic, the sampler's weights and the run's health state.

Three distributions (seed 000): the reference is frozen (scored by the batch source, never trained); the training
policy is `self.model`; the rollout policy is the sampler's copy, which gets the training weights after every
applied policy step with the version `self.step` (GRPO's push: GrpoTrainModule.push_weights). The batch source
checks every sample's version against it, so a rollout from stale weights is never trained on.

Per micro-batch (one sum over its loss tokens; the Trainer divides by the step's global token count):
    l_t = max(-A_t r_t, -A_t clip(r_t, 1 - eps, 1 + eps))        policy (r_t = exp(logp_t - old_t))
        + value_coef * 1/2 max((V_t - R_t)^2, (V_old_t + clip(V_t - V_old_t, -c, c) - R_t)^2)     critic
        - entropy_coef * H_t                                      (differentiable only when entropy_coef > 0)
        + kl_beta * k3(logp_t, ref_t)                             (only when [ppo] kl_in = "loss")
A row whose advantages are 0 on every loss token (a wrong sample under [gae] negative_scale = 0) adds nothing to the
policy's terms when there is no entropy bonus and no KL in the loss: with `[loss] zero_gradient_rows = "skip"` (the
default) it skips the policy's forward and backward (align.rl.ppo.loss.policy_rows) and trains the critic only; the
logged entropy, ratio and advantage means then cover the forwarded rows.
The critic's parameters are disjoint from the policy's, so one backward fills both; each has its own optimizer
and gradient clip. The critic has a constant learning rate (its own [critic_optimizer] table); its fresh value head
may train at a multiple of it ([critic_head] lr_scale, the reward model's [head] rule). Since the critic has its own
Adam, `value_coef` scales the critic's gradient only, which Adam normalises away: it matters through the
critic's gradient clip (and Adam's eps), not as a weight against the policy's loss.

Critic-only warmup: a micro-batch flagged `critic_only` (the first `critic_warmup_rollouts` rollouts) trains the
critic alone: no policy forward, no policy step, no schedule tick, no weight push (the policy version stays). The
step is APPLIED (the critic moved), so the Trainer never counts it as a skip; its history row says `critic_only` 1.

Extra value-only passes (`[ppo] critic_extra_epochs` = K): after every APPLIED step (warmup's included) the critic
makes K more passes over the step's own micro-batches, each one critic optimizer step on the joint step's value term
(the same value clip, anchored at the rollout's values, the same scale and gradient clip); the policy is not run,
not stepped and not pushed. They are part of the applied step, so the Trainer sees one step as before; a pass whose
gradient is non-finite is not stepped (`critic_extra_skipped` in the row), never a Trainer skip. The row logs the
rollout's value loss at the start of the first and of the last pass (`critic_extra_loss_first` / `_last`: after
the joint step and after K - 1 extra steps). Nothing of it outlives the step but the critic's weights and Adam
state, which the checkpoint already carries: resume stays bitwise.

Health: `ratio_skip_abs_log` (the ratio tripwire with skip tracking): a step whose mean |log r| over its loss
tokens exceeds it changes nothing (SKIPPED: counted by the Trainer's skip caps, HALT 81 when they are exceeded;
`ratio_skipped` 1 in its row). GRPO's GrpoHealth (entropy, ratio mean, reward collapse) watches every step as in
GRPO. `explained_variance` = 1 - Var(R - V_old) / Var(R) over the step's loss tokens: how much of the return the
critic predicted before it was fitted to this rollout.

State: the critic's weights and its optimizer's state are this module's (its extra state in resume.pt, beside
GRPO's health state; a sharded critic's in each rank's module state, below); the policy's weights and optimizer
are the Trainer's as for every module.

Several ranks: the policy is wrapped as every TrainModule's (DDP or FSDP2, [parallel]), and every value goes
through `critic_net` (align.rl.ppo.critic), rank 0's critic weights broadcast first. Under FSDP2 the critic is sharded
the same way (`fully_shard` per decoder block and its own root unit; its gradient sync follows the window like the
policy's, its reduce-scatter averages the gradients): each rank holds 1/N of its weights, gradients and Adam state,
and a checkpoint keeps each rank's shard in that rank's own module-state file (`state_dict`; nothing of it is
gathered), the full critic gathered only for `<run_dir>/critic/`. Under DDP the critic is replicated outside the
wrapper: each rank's backward fills its own critic gradients, and `optim_step` replaces them by their mean over
ranks (one all-reduce of them packed) before the norm, the clip and the step, so every rank's critic takes the same
step; a checkpoint holds that critic and its Adam state once (rank 0's; the other ranks' resume state points at
it). A critic-only micro-batch runs on the bare policy (the policy's wrapper would wait for gradients no forward
produced). The ratio tripwire's sums are all-reduced before its verdict; the extra value-only passes reduce their
gradients and losses the same way."""

from __future__ import annotations

import math

import torch
from torch import nn

from align.rl.ppo.critic import critic_net
from align.rl.ppo.entropy import token_entropy
from align.rl.ppo.loss import PpoLossConfig, policy_per_token, policy_rows, value_per_token
from align.rl.ppo.stage_config import PpoConfig
from align.rl.assembly import check_layout, select_rows
from align.rl.grpo_loss import GrpoLossConfig, k3_kl
from align.rl.grpo_module import GrpoTrainModule, policy_tokens, rollout_metrics, row_counts
from align.rl.token_logprobs import completion_rows, head_inputs, tempered_token_logprobs, unflatten
from align.rl.tripwires import GrpoHealth
from align.train.grad_norm import clip_grads_, global_grad_norm
from align.train.optim import OptimizerConfig, make_optimizer
from align.train.parallel import grad_sync
from align.reward.rm_module import RmHeadConfig, split_head_group
from align.train.schedulers import lr_multiplier
from align.train.train_module import REPLICATED, AccumInfo, LossOutput, StepMetrics, StepOutcome, TrainModule, \
    TrainModuleConfig, full_state_dict, load_local_state_dict, local_state_dict, localize, rewrap_dtensor_state, \
    to_device
from align.utils.dist import all_reduce_sum, all_reduce_tensors_, broadcast_tensors_, device, packable_grads, rank, \
    world_size

POLICY_SUMS = ("policy_tokens", "policy_loss_sum", "clip_sum", "ratio_sum", "ratio_abs_log_sum", "entropy_sum",
               "entropy_tokens", "adv_abs_sum", "kl_sum", "rho_abs_log_sum")


class PpoTrainModule(GrpoTrainModule):
    def __init__(self, model: nn.Module, critic: nn.Module, cfg: TrainModuleConfig,
                 critic_optimizer: OptimizerConfig, loss_cfg: PpoLossConfig, ppo: PpoConfig, temperature: float,
                 total_steps: int, seed: int = 0, client=None, health: GrpoHealth | None = None,
                 critic_head: RmHeadConfig = RmHeadConfig()):
        # GRPO's view of the loss config: only its scoring path is used (pi_old through the same head kernel)
        scoring = GrpoLossConfig(clip_low=loss_cfg.clip, clip_high=loss_cfg.clip, rho_cap=None, fused=False,
                                 chunk_size=loss_cfg.chunk_size, head_dtype=loss_cfg.head_dtype, kernel=loss_cfg.kernel)
        super().__init__(model, cfg, scoring, temperature, constant_length=1, total_steps=total_steps, seed=seed,
                         client=client, health=health)
        self.ppo_loss, self.ppo, self.critic = loss_cfg, ppo, critic
        self.critic_cfg = critic_optimizer
        broadcast_tensors_(list(critic.state_dict().values()))  # one critic on every rank: rank 0's
        self.critic_net, self.critic_sharded = critic_net(critic, cfg.parallel)  # FSDP2 beside an FSDP2 policy
        self.critic_optimizer, self.critic_banner = make_optimizer(critic, critic_optimizer, seed=seed)
        if critic_head.lr_scale != 1.0:  # the fresh value head learns faster than the trained trunk (as the RM's)
            split_head_group(self.critic_optimizer, critic.score, critic_head.lr_scale)
            self.critic_banner += f"; score_head: lr x {critic_head.lr_scale}"
        self._critic_only = False  # the latest window trained the critic alone (warmup)
        self.ratio_skipped = False  # the latest boundary was skipped by the ratio tripwire
        self._ratio_abs_log, self._ratio_tokens = 0.0, 0.0
        self._window_batches: list[dict] = []  # the step's micro-batches, kept for the extra value-only passes

    # ------------------------------------------------------------------------------------------------ the seam
    def loss(self, model: nn.Module, batch: dict) -> LossOutput:
        if batch.get("score_only"):
            return super().loss(model, batch)
        check_layout(batch)
        cfg, mask = self.ppo_loss, batch["loss_mask"]
        values = self.critic_net(batch)
        v_tok, v_clipped = value_per_token(values, batch["old_values"], batch["returns"], cfg.value_clip)
        per_token = cfg.value_coef * v_tok
        sums = self._critic_sums(batch, values, v_tok, v_clipped)
        if not batch.get("critic_only"):
            policy_tok, policy = self._policy_terms(model, batch)
            per_token = per_token + policy_tok
            sums.update(policy)
        else:
            sums.update(dict.fromkeys(POLICY_SUMS, torch.zeros(())))
        total = (per_token * mask).sum()
        sums["loss_sum"] = total.detach().float()
        return LossOutput(total, {k: torch.as_tensor(v).detach().float().cpu() for k, v in sums.items()})

    def _policy_terms(self, model: nn.Module, batch: dict) -> tuple[torch.Tensor, dict]:
        """The policy's per-token terms (B, C) and sums; with `[loss] zero_gradient_rows = "skip"` only the rows
        that carry a policy gradient go through the policy (align.rl.ppo.loss.policy_rows), the others' terms are 0."""
        rows = policy_rows(batch, self.ppo_loss, self.ppo) if self.ppo_loss.zero_gradient_rows == "skip" else None
        if rows is None:
            return self._policy_terms_of(model, batch)
        flags = {k: v for k, v in batch.items() if not torch.is_tensor(v)}
        per_token, sums = self._policy_terms_of(model, {**flags, **select_rows(batch, rows)})
        full = torch.zeros(batch["loss_mask"].shape, dtype=per_token.dtype, device=per_token.device)
        cols = torch.arange(per_token.shape[1], device=per_token.device)  # the subset is trimmed to its longest row
        return full.index_put((rows[:, None], cols[None, :]), per_token), sums

    def _policy_terms_of(self, model: nn.Module, batch: dict) -> tuple[torch.Tensor, dict]:
        cfg, mask, comp = self.ppo_loss, batch["loss_mask"], policy_tokens(batch)  # no environment tokens
        hidden, targets, real = completion_rows(model, batch)
        hidden, weight = head_inputs(hidden, model.lm_head.weight, self.head_dtype)
        logp_flat, ent_flat = tempered_token_logprobs(hidden, weight, targets, self.temperature, cfg.chunk_size,
                                                      self.native)  # the scorer's kernel: pi_old agrees bitwise
        logp, entropy = unflatten(logp_flat, real), unflatten(ent_flat, real)
        adv, old = batch["token_advantages"], self._old_logprobs(batch, logp)  # pi_old (or this forward's)
        per_token, clipped, ratio = policy_per_token(logp, old, adv, cfg.clip)
        if cfg.entropy_coef > 0:
            per_token = per_token - cfg.entropy_coef * unflatten(
                token_entropy(hidden, weight, self.temperature, cfg.chunk_size), real)
        kl = torch.zeros_like(mask)
        if self.ppo.kl_in == "loss" and self.ppo.kl_beta > 0:
            kl_t = k3_kl(logp, batch["ref_logprobs"])
            per_token = per_token + self.ppo.kl_beta * kl_t
            kl = kl_t.detach()
        with torch.no_grad():
            log_r = (logp.detach() - old) * mask
            sums = {"policy_tokens": mask.sum(), "policy_loss_sum": (per_token.detach() * mask).sum(),
                    "clip_sum": (clipped * mask).sum(), "ratio_sum": (ratio * mask).sum(),
                    "ratio_abs_log_sum": log_r.abs().sum(), "entropy_sum": (entropy * comp).sum(),
                    "entropy_tokens": comp.sum(), "adv_abs_sum": (adv.abs() * mask).sum(), "kl_sum": (kl * mask).sum(),
                    "rho_abs_log_sum": ((old - batch["rollout_logprobs"]).abs() * comp).sum()}
        return per_token, sums

    @torch.no_grad()
    def _critic_sums(self, batch: dict, values, v_tok, v_clipped) -> dict:
        mask = batch["loss_mask"]
        ret, resid = batch["returns"], batch["returns"] - batch["old_values"]
        sums = {**row_counts(batch), "units": self.loss_units(batch), "value_loss_sum": (v_tok.detach() * mask).sum(),
                "value_clip_sum": (v_clipped * mask).sum(), "value_sum": (values.detach() * mask).sum(),
                "return_sum": (ret * mask).sum(), "return_sq": (ret.square() * mask).sum(),
                "resid_sum": (resid * mask).sum(), "resid_sq": (resid.square() * mask).sum()}
        for key, value in batch.get("stats", {}).items():
            sums[key] = value
        return sums

    def loss_units(self, batch: dict) -> float:
        return float(batch["loss_mask"].sum())

    def log_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        """The step's global sums -> logged means (every column on every step: NaN when undefined)."""
        def div(a: str, b: str) -> float:
            return sums.get(a, 0.0) / sums[b] if sums.get(b) else float("nan")

        n = sums.get("loss_tokens") or 0.0
        var_ret = div("return_sq", "loss_tokens") - div("return_sum", "loss_tokens") ** 2
        var_res = div("resid_sq", "loss_tokens") - div("resid_sum", "loss_tokens") ** 2
        out = {"loss": div("loss_sum", "units"), "policy_loss": div("policy_loss_sum", "policy_tokens"),
               "value_loss": div("value_loss_sum", "loss_tokens"),
               "value_clip_frac": div("value_clip_sum", "loss_tokens"), "clip_frac": div("clip_sum", "policy_tokens"),
               "ratio_mean": div("ratio_sum", "policy_tokens"),
               "ratio_abs_log_mean": div("ratio_abs_log_sum", "policy_tokens"),
               "entropy": div("entropy_sum", "entropy_tokens"), "kl": div("kl_sum", "policy_tokens"),
               "rho_abs_log_mean": div("rho_abs_log_sum", "entropy_tokens"),
               "adv_abs_mean": div("adv_abs_sum", "policy_tokens"), "value_mean": div("value_sum", "loss_tokens"),
               "return_mean": div("return_sum", "loss_tokens"),
               "explained_variance": 1.0 - var_res / var_ret if n > 1 and var_ret > 0 else float("nan"),
               "reward_mean": div("reward_sum", "seqs"), "accuracy": div("correct", "seqs"),
               "truncated_frac": div("truncated", "seqs"), "completion_len": div("completion_tokens", "seqs"),
               "input_tokens": sums.get("input_tokens", 0.0), "sequences": sums.get("seqs", 0.0),
               "critic_only": float(self._critic_only), "ratio_skipped": float(self.ratio_skipped),
               "empty_step": float(self.empty_reason is not None),
               "rollout/kl": div("rollout/kl_sum", "rollout/kl_tokens"),
               "rollout/rm_score_mean": div("rollout/rm_score_sum", "rollout/rm_rows")}
        if self.empty_reason is not None:
            out["loss"] = 0.0  # the objective of an empty set
        out.update(rollout_metrics(sums))
        return out

    # ------------------------------------------------------------------------------------------------ scoring
    @torch.no_grad()
    def values(self, batch: dict) -> torch.Tensor:
        """(N, C) critic values of the batch's completions under the current critic weights."""
        return self.critic_net(to_device(batch, device()))

    # ------------------------------------------------------------------------------------------------ the step
    def train_batch(self, batch: dict, accum: AccumInfo) -> StepMetrics:
        self._critic_only = bool(batch.get("critic_only"))
        self.critic_net.train()
        with grad_sync(self.critic_net, accum.is_last or self.cfg.parallel.sync_every_micro_batch):  # (FSDP2's)
            out = TrainModule.train_batch(self, batch, accum, bare=self._critic_only)  # warmup: no policy part
        self._window_units = accum.global_units
        self._ratio_abs_log += float(out.sums["ratio_abs_log_sum"])
        self._ratio_tokens += float(out.sums["policy_tokens"])
        if self.ppo.critic_extra_epochs:
            self._window_batches.append(batch)
        return out

    def _mean_critic_grads(self, params: list[nn.Parameter]) -> None:
        """The replicated critic's gradients -> their mean over ranks (DDP's rule; the policy's wrapper does it for
        the policy). A rank whose critic saw no row packs zeros, so every rank reduces the same layout. A sharded
        critic's reduce-scatter has averaged them already."""
        if world_size() == 1 or self.critic_sharded:
            return
        grads = packable_grads(params)
        all_reduce_tensors_(grads)
        torch._foreach_div_(grads, float(world_size()))

    def optim_step(self) -> StepOutcome:
        self.empty_reason = "no_loss_tokens" if self._window_units == 0 else None
        critic_params = [p for p in self.critic.parameters() if p.requires_grad]
        self._mean_critic_grads(critic_params)
        critic_norm = global_grad_norm(critic_params, local_nonfinite=bool(self._window_bad))
        mult = lr_multiplier(self.cfg.scheduler, self.step, self.total_steps)
        self.last = {"grad_norm": math.nan, "lr": self.cfg.optimizer.lr * mult, "clip_coef": 1.0,
                     "critic_grad_norm": critic_norm, "critic_clip_coef": 1.0, "critic_extra_steps": 0.0,
                     "critic_extra_skipped": 0.0, "critic_extra_loss_first": math.nan,
                     "critic_extra_loss_last": math.nan}
        limit = self.ppo.ratio_skip_abs_log
        abs_log, tokens = all_reduce_sum([self._ratio_abs_log, self._ratio_tokens]).tolist()  # one verdict
        mean_abs_log = abs_log / tokens if tokens else 0.0
        self.ratio_skipped = limit is not None and mean_abs_log > limit
        if self.empty_reason is not None:
            return StepOutcome.EMPTY
        if self.ratio_skipped or not math.isfinite(critic_norm):
            return StepOutcome.SKIPPED
        if not self._critic_only:
            extra = {k: v for k, v in self.last.items() if k.startswith("critic_")}
            outcome = TrainModule.optim_step(self)  # the policy: clip, schedule, step (or SKIPPED on non-finite)
            self.last.update(extra)
            if outcome is not StepOutcome.APPLIED:
                return outcome
            self.push_weights()  # the rollout policy = the training policy after every applied update
        if self.critic_cfg.max_grad_norm is not None:
            self.last["critic_clip_coef"] = clip_grads_(critic_params, critic_norm, self.critic_cfg.max_grad_norm)
        self.critic_optimizer.step()
        if self.ppo.critic_extra_epochs:
            self._refit_critic(critic_params)
        return StepOutcome.APPLIED

    def _refit_critic(self, params: list[nn.Parameter]) -> None:
        """`[ppo] critic_extra_epochs` value-only passes over the step's micro-batches, one critic step each."""
        scale = world_size() / self._window_units  # the Trainer's normalisation of the joint step
        losses, applied, skipped = [], 0, 0
        for _ in range(self.ppo.critic_extra_epochs):
            self.critic_optimizer.zero_grad(set_to_none=True)
            total = 0.0
            for i, batch in enumerate(self._window_batches):
                batch = to_device(batch, device())
                with grad_sync(self.critic_net, i == len(self._window_batches) - 1):
                    v_tok, _ = value_per_token(self.critic_net(batch), batch["old_values"], batch["returns"],
                                               self.ppo_loss.value_clip)
                    loss = (v_tok * batch["loss_mask"]).sum()
                    (self.ppo_loss.value_coef * scale * loss).backward()
                total += float(loss.detach())
            losses.append(float(all_reduce_sum([total])[0]) / self._window_units)
            self._mean_critic_grads(params)
            norm = global_grad_norm(params)
            if not math.isfinite(norm):  # this pass is not stepped; the step itself stays applied
                skipped += 1
                continue
            if self.critic_cfg.max_grad_norm is not None:
                clip_grads_(params, norm, self.critic_cfg.max_grad_norm)
            self.critic_optimizer.step()
            applied += 1
        self.last.update(critic_extra_steps=float(applied), critic_extra_skipped=float(skipped),
                         critic_extra_loss_first=losses[0], critic_extra_loss_last=losses[-1])

    def zero_grads(self) -> None:
        super().zero_grads()
        self.critic_optimizer.zero_grad(set_to_none=True)
        self._ratio_abs_log, self._ratio_tokens = 0.0, 0.0
        self._window_batches = []

    # ------------------------------------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """The policy's optimizer state and step; a sharded critic's shard and its Adam state ride here too, so each
        rank writes its own in its own file (nothing of them is gathered)."""
        state = super().state_dict()
        if self.critic_sharded:
            state["critic"] = local_state_dict(self.critic)
            state["critic_optimizer"] = localize(self.critic_optimizer.state_dict())
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if self.critic_sharded:
            load_local_state_dict(self.critic, state["critic"])
            self.critic_optimizer.load_state_dict(state["critic_optimizer"])
            rewrap_dtensor_state(self.critic_optimizer)

    def full_critic_state_dict(self) -> dict[str, torch.Tensor]:
        """The critic's full weights on rank 0 ({} elsewhere); collective when it is sharded."""
        return full_state_dict(self.critic)

    def extra_state(self) -> dict:
        """GRPO's health state, and a replicated critic with its optimizer: rank 0's only (every rank holds the
        same replica; the others point at it, align.train.train_module.REPLICATED), so a checkpoint keeps one copy.
        (A sharded critic is in `state_dict`.)"""
        if self.critic_sharded:
            return super().extra_state()
        if rank() > 0:
            return {**super().extra_state(), REPLICATED: ["critic", "critic_optimizer"]}
        return {**super().extra_state(),
                "critic": {k: v.detach().cpu().clone() for k, v in self.critic.state_dict().items()},
                "critic_optimizer": self.critic_optimizer.state_dict()}

    def load_extra_state(self, state: dict) -> None:
        if self.critic_sharded:
            return super().load_extra_state(state)
        missing = sorted({"critic", "critic_optimizer"} - set(state))
        if missing:
            raise ValueError(f"PpoTrainModule: the checkpoint's extra state lacks {missing} (not a PPO checkpoint)")
        super().load_extra_state(state)
        self.critic.load_state_dict(state["critic"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
