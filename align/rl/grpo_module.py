"""`GrpoTrainModule`: GRPO on the TrainModule seam. The loss formulas are align.rl.grpo_loss; this file wires them to
the model, the sampler's weights and the run's health state.

Per micro-batch (align.rl.types layout): one forward of the policy over prompt + completion, per-token log-probs and
entropies at the sampling temperature (align.rl.token_logprobs, chunked head), then the per-token objective
(clipped surrogate x train/infer weight + beta k3) summed as `loss_sum`; `loss_units` gives the normaliser's
share (tokens, sequences, or sequences x L), which the Trainer totals over the step and every rank first.

Weights and versions: the sampler (a RolloutClient, usually an Engine on its own copy of the weights) gets the new
weights in memory after every applied optimizer step, tagged with the step count: the policy's version is
`self.step`, and the batch source checks every sample against it. A skipped step changes nothing, so nothing is
pushed. After a resume the restored weights are pushed with the restored step.

Scoring for the batch source (`score`): the same log-prob path without gradient, run through the wrapped unit so
FSDP2 unshards what it must; it gives pi_old (the training model at the rollout's weights) and, for a reference
module, the reference's log-probs.

Empty steps: a window with nothing to learn from (no loss token: every completion truncated and masked; or every
advantage 0 and no KL term: every group had zero reward variance after dynamic sampling's retries) is an explicit
empty step: no optimizer update, no schedule tick, no weight push; the history row says `empty_step` 1 and why
(`empty/no_loss_tokens`, `empty/zero_advantage`), and its loss is 0 (the objective of an empty set), not NaN.
`optim_step` returns `StepOutcome.EMPTY` for it, so the Trainer does NOT count it toward the non-finite skip cap (a
rollout whose prompts are all solved or all hopeless is a fact about the data, not a fault) and logs `applied` 0 (no
weight moved; the weight-stall probe does not count it). A non-finite window is never empty: it stays a fault.

Rows left out of the forward (`skipped`, align.rl.zero_rows: exactly zero loss and gradient): their loss units
join `loss_units`, so the normaliser is the same as if they had trained, and the statistics that need no forward
(`seqs`, reward, correct, truncated, lengths, advantage sums, staleness) count them; the forward's per-token
statistics (`entropy`, `ratio_mean`, `rho_*`) cover the forwarded rows only (`trained_*` denominators), and
`rows_skipped` says how many were left out. The clip fractions stay over every loss token: a left-out row can
never clip (clip-low needs A < 0, clip-high A > 0, both a loss token), so they are the same numbers as before.

Health: `self.health` (align.rl.tripwires.GrpoHealth) keeps the tripwires' windows and latches; they are this
module's extra state, so a resumed run remembers a collapsing reward."""

from __future__ import annotations

import torch
from torch import nn

from align.kernels.fused_ce import use_native
from align.rl.assembly import check_layout
from align.rl.grpo_loss import GrpoLossConfig, clip_fractions, loss_sum, loss_units, policy_terms
from align.rl.fused_objective import fused_token_objective
from align.rl.token_logprobs import completion_logprobs, completion_rows, head_inputs, unflatten
from align.rl.tripwires import GrpoHealth
from align.train.grad_norm import global_grad_norm
from align.train.schedulers import lr_multiplier
from align.train.train_module import (AccumInfo, LossOutput, StepMetrics, StepOutcome, TrainModule,
                                      TrainModuleConfig)
from align.utils.dist import all_reduce_sum

RATIO_KEYS = ("ratio_sum", "clip_low", "clip_high", "rho_abs_log_sum", "rho_capped", "rho_outliers")
EMPTY_REASONS = ("no_loss_tokens", "zero_advantage")


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def token_advantages(batch: dict) -> torch.Tensor:
    """The advantage each loss token sees, (N, 1) (the row's) or (N, C) with step credit (align.rl.step_credit)."""
    adv = batch["advantages"][:, None]
    return adv + batch["step_advantages"] if "step_advantages" in batch else adv


def rollout_metrics(sums: dict[str, float]) -> dict[str, float]:
    """The batch source's `rollout/*` columns: `rollout/reward_mean`, the sampled policy's reward over every valid
    generated group (NaN on a step that sampled nothing), and `rollout/term_mean/<label>` each reward term's
    unweighted mean over the same samples; timings (`*_s`) per rank; counts as summed."""
    samples = sums.get("rollout/samples")
    out = {"rollout/reward_mean": sums.get("rollout/reward_sum", 0.0) / samples if samples else float("nan")}
    if "rollout/env_turns" in sums:  # multi-turn (align.rl.environment): the share of samples that used the tool
        out["rollout/tool_call_rate"] = sums["rollout/env_samples_with_turns"] / samples if samples else float("nan")
    for key, value in sums.items():  # each reward term's mean over the same samples (align.rl.reward_terms)
        if key.startswith("rollout/term_sum/"):
            out["rollout/term_mean/" + key.removeprefix("rollout/term_sum/")] = value / samples if samples else \
                float("nan")
    ranks = sums.get("rollout/ranks") or 1.0
    for key, value in sums.items():
        if key.startswith("rollout/") and key != "rollout/ranks":
            out[key] = value / ranks if key.endswith("_s") else value
    return out


def policy_tokens(batch: dict) -> torch.Tensor:
    """(N, C) 1 on the tokens the policy sampled: the completion without an environment's observation tokens
    (`policy_mask`, multi-turn only), which the policy did not choose and the sampler gave log-prob 0; the per-token
    statistics (entropy, rho) average over these."""
    comp = batch["completion_mask"]
    return comp * batch["policy_mask"] if "policy_mask" in batch else comp


def row_counts(rows: dict) -> dict[str, torch.Tensor]:
    """Per-row sums of a rollout batch that need no forward (GRPO's and PPO's statistics): sequences, loss /
    completion / input tokens, reward, correct and truncated rows."""
    mask, comp = rows["loss_mask"], rows["completion_mask"]
    return {"seqs": torch.as_tensor(float(mask.shape[0])), "loss_tokens": mask.sum(), "completion_tokens": comp.sum(),
            "input_tokens": (rows["completion_start"].float() + comp.sum(1)).sum(),
            "reward_sum": rows["rewards"].sum(), "correct": rows["correct"].sum(),
            "truncated": rows["truncated"].sum()}


class GrpoTrainModule(TrainModule):
    def __init__(self, model: nn.Module, cfg: TrainModuleConfig, loss_cfg: GrpoLossConfig, temperature: float,
                 constant_length: int, total_steps: int, seed: int = 0, client=None,
                 health: GrpoHealth | None = None):
        """`client`: the RolloutClient that receives the weights after each step (None: nobody samples from this
        policy, e.g. a scoring-only reference). `constant_length`: L of the "constant" normalisation."""
        self.loss_cfg, self.temperature = loss_cfg, temperature
        self.constant_length = loss_cfg.constant_length or constant_length
        self.head_dtype = torch.bfloat16 if loss_cfg.head_dtype == "bfloat16" else None
        self.native = use_native(loss_cfg.kernel, model.lm_head.weight.device)  # the head's row passes in C
        super().__init__(model, cfg, total_steps, seed)
        self.client = client
        self.health = health if health is not None else GrpoHealth()
        self.empty_reason: str | None = None  # why the latest boundary was an empty step (None: it was not)
        self._window_units, self._window_signal = 0.0, 0.0

    # ------------------------------------------------------------------------------------------------ the seam
    def loss(self, model: nn.Module, batch: dict) -> LossOutput:
        if batch.get("score_only"):
            with torch.no_grad():
                logp, _ = completion_logprobs(model, batch, self.temperature, self.loss_cfg.chunk_size,
                                              self.head_dtype, self.native)
            return LossOutput(logp.new_zeros(()), {"logprobs": logp})
        check_layout(batch)
        cfg = self.loss_cfg
        if cfg.fused and cfg.ratio_level == "token":
            return self._fused_loss(model, batch)
        logp, entropy = completion_logprobs(model, batch, self.temperature, cfg.chunk_size, self.head_dtype,
                                            self.native)
        mask = batch["loss_mask"]
        terms = policy_terms(logp, self._old_logprobs(batch, logp), batch["rollout_logprobs"],
                             token_advantages(batch), mask, cfg, batch.get("ref_logprobs"))
        total = loss_sum(terms.per_token, mask, cfg.normalisation)
        return LossOutput(total, self._statistics(batch, entropy, terms, total))

    def _fused_loss(self, model: nn.Module, batch: dict) -> LossOutput:
        """The same objective with the head's gradient formed in forward (align.rl.fused_objective): each real
        completion token's l_i (policy_terms on that token alone) times its share of the normaliser."""
        cfg = self.loss_cfg
        hidden, targets, real = completion_rows(model, batch)
        mask = batch["loss_mask"]
        per_row = mask / mask.sum(-1, keepdim=True).clamp(min=1.0) if cfg.normalisation == "sequence" else mask
        flat = {k: batch[k][real] for k in ("old_logprobs", "rollout_logprobs", "ref_logprobs") if k in batch}
        scale, adv = per_row[real], token_advantages(batch).expand_as(mask)[real]
        from_forward = bool(batch.get("old_from_forward"))
        if from_forward:
            self._old_logprobs(batch, None)  # the version check only

        def objective(x: torch.Tensor, rows: slice) -> torch.Tensor:
            old = x.detach() if from_forward else flat["old_logprobs"][rows]
            ref = flat["ref_logprobs"][rows, None] if "ref_logprobs" in flat else None
            terms = policy_terms(x[:, None], old[:, None], flat["rollout_logprobs"][rows, None], adv[rows],
                                 torch.ones_like(x[:, None]), cfg, ref)
            return terms.per_token[:, 0] * scale[rows]

        hidden, weight = head_inputs(hidden, model.lm_head.weight, self.head_dtype)
        total, logp, entropy = fused_token_objective(hidden, weight, targets, self.temperature, objective,
                                                     cfg.chunk_size, self.native)
        logp, entropy = unflatten(logp, real), unflatten(entropy, real)
        with torch.no_grad():  # the (N, C) terms again, for the logged statistics only
            terms = policy_terms(logp, logp if from_forward else batch["old_logprobs"], batch["rollout_logprobs"],
                                 token_advantages(batch), mask, cfg, batch.get("ref_logprobs"))
        return LossOutput(total, self._statistics(batch, entropy, terms, total))

    def _old_logprobs(self, batch: dict, logp: torch.Tensor) -> torch.Tensor:
        """pi_old: this very forward when the batch trains on the weights that sampled it (`old_from_forward`),
        else the log-probs the batch source scored before the policy moved."""
        if not batch.get("old_from_forward"):
            return batch["old_logprobs"]
        lag = self.step - batch["weight_version"]
        if bool((lag != 0).any()):
            raise RuntimeError(f"a batch flagged old_from_forward lags the policy by {int(lag.max())} steps: its "
                               f"training forward is not pi_old")
        return logp.detach() if logp is not None else None

    def loss_units(self, batch: dict) -> float:
        units = loss_units(batch["loss_mask"], self.loss_cfg.normalisation, self.constant_length)
        if "skipped" in batch:  # rows left out of the forward still count in the normaliser
            units += self.loss_units(batch["skipped"])
        return units

    def _row_sums(self, rows: dict) -> dict[str, torch.Tensor]:
        """The statistics of rows that need no forward (every row of the window, forwarded or left out)."""
        return {**row_counts(rows), "adv_abs_sum": rows["advantages"].abs().sum(),
                "staleness_sum": (self.step - rows["weight_version"]).float().sum()}

    @torch.no_grad()
    def _statistics(self, batch: dict, entropy: torch.Tensor, terms, total: torch.Tensor) -> dict:
        mask, comp = batch["loss_mask"], policy_tokens(batch)  # comp: without an environment's tokens
        ratio = terms.ratio.expand_as(mask)
        low, high = (x.expand_as(mask).float() for x in clip_fractions(terms.ratio, token_advantages(batch),
                                                                          self.loss_cfg))
        w = terms.weight
        rho, outlier = w.rho.expand_as(comp), w.outlier.expand_as(comp).float()
        capped = (rho > self.loss_cfg.rho_cap).float() if self.loss_cfg.rho_cap is not None else torch.zeros_like(rho)
        t = lambda x: torch.as_tensor(float(x), dtype=torch.float32)  # noqa: E731
        sums = {
            **self._row_sums(batch), "units": t(self.loss_units(batch)), "loss_sum": total.detach().float(),
            "trained_loss_tokens": mask.sum(), "trained_completion_tokens": comp.sum(),
            "entropy_sum": (entropy * comp).sum(), "ratio_sum": (ratio * mask).sum(),
            "clip_low": (low * mask).sum(), "clip_high": (high * mask).sum(),
            "rho_abs_log_sum": (rho.log().abs() * comp).sum(), "rho_capped": (capped * comp).sum(),
            "rho_outliers": (outlier * comp).sum(),
            "kl_sum": (terms.kl * mask).sum() if terms.kl is not None else t(0.0), "rows_skipped": t(0.0),
        }
        for key, value in batch.get("stats", {}).items():
            sums[key] = t(value)
        return {k: v.detach().float().cpu() for k, v in sums.items()}

    def log_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        """The step's global sums -> logged means (every column on every step: NaN when undefined)."""
        def div(a: str, b: str) -> float:
            return sums.get(a, 0.0) / sums[b] if sums.get(b) else float("nan")

        out = {"loss": div("loss_sum", "units"), "reward_mean": div("reward_sum", "seqs"),
               "accuracy": div("correct", "seqs"), "truncated_frac": div("truncated", "seqs"),
               "adv_abs_mean": div("adv_abs_sum", "seqs"), "completion_len": div("completion_tokens", "seqs"),
               "entropy": div("entropy_sum", "trained_completion_tokens"),
               "ratio_mean": div("ratio_sum", "trained_loss_tokens"),
               "clip_low_frac": div("clip_low", "loss_tokens"), "clip_high_frac": div("clip_high", "loss_tokens"),
               "rho_abs_log_mean": div("rho_abs_log_sum", "trained_completion_tokens"),
               "rho_capped_frac": div("rho_capped", "trained_completion_tokens"),
               "rho_outlier_frac": div("rho_outliers", "trained_completion_tokens"),
               "rows_skipped": sums.get("rows_skipped", 0.0),
               "kl": div("kl_sum", "loss_tokens"), "staleness": div("staleness_sum", "seqs"),
               "input_tokens": sums.get("input_tokens", 0.0), "sequences": sums.get("seqs", 0.0),
               "empty_step": float(self.empty_reason is not None)}
        for reason in EMPTY_REASONS:
            out[f"empty/{reason}"] = float(self.empty_reason == reason)
        if self.empty_reason is not None:
            out["loss"] = 0.0  # the objective of an empty set (units may be 0: the division would give NaN)
        out.update(rollout_metrics(sums))
        return out

    # ------------------------------------------------------------------------------------------------ scoring
    def score(self, batch: dict) -> torch.Tensor:
        """(N, C) log-probs of the batch's completions under the current weights, no gradient."""
        dev = self.model.lm_head.weight.device
        moved = {k: v.to(dev) if torch.is_tensor(v) else v for k, v in batch.items()}
        with torch.no_grad():
            out = self.net({**moved, "score_only": True})
        return out.sums["logprobs"]

    @property
    def version(self) -> int:
        return self.step

    # ------------------------------------------------------------------------------------------------ the step
    def train_batch(self, batch: dict, accum: AccumInfo) -> StepMetrics:
        skipped = batch.get("skipped")
        if skipped is not None:  # counted here, beside the forward: the wrapped unit never sees them
            batch = {k: v for k, v in batch.items() if k != "skipped"}
        out = super().train_batch(batch, accum)
        self._window_units = accum.global_units  # already summed over the window and every rank
        self._window_signal += float((token_advantages(batch).abs() * batch["loss_mask"]).sum())
        if skipped is not None:  # zero signal by construction: advantage 0 or no loss token
            extra = {**self._row_sums(skipped), "rows_skipped": torch.as_tensor(float(skipped["loss_mask"].shape[0])),
                     "units": torch.as_tensor(self.loss_units(skipped))}
            for key, value in extra.items():
                value = value.detach().float()
                out.sums[key] = out.sums[key] + value.to(out.sums[key].device) if key in out.sums else value
        return out

    def _empty(self) -> str | None:
        """Why this window is an empty step (None: it is not); the same answer on every rank (one all-reduce)."""
        signal, bad = all_reduce_sum([self._window_signal, float(bool(self._window_bad))]).tolist()
        if bad:
            return None  # a non-finite window is a fault: the base class skips it and the Trainer counts it
        if self._window_units == 0:
            return "no_loss_tokens"
        if signal == 0 and self.loss_cfg.kl_beta == 0:  # with a KL term the window still pulls towards the ref
            return "zero_advantage"
        return None

    def optim_step(self) -> StepOutcome:
        self.empty_reason = self._empty()
        if self.empty_reason is None:
            outcome = super().optim_step()
            if outcome is StepOutcome.APPLIED:
                self.push_weights()
            return outcome
        # NOTE: no optimizer.step(): AdamW would still move the weights on momentum (and weight decay) with a zero
        # gradient, and the schedule and the policy version would tick for a step that learned nothing.
        params = [p for p in self.model.parameters() if p.requires_grad]
        mult = lr_multiplier(self.cfg.scheduler, self.step, self.total_steps)
        self.last = {"grad_norm": global_grad_norm(params), "lr": self.cfg.optimizer.lr * mult, "clip_coef": 1.0}
        return StepOutcome.EMPTY

    def zero_grads(self) -> None:
        super().zero_grads()
        self._window_units, self._window_signal = 0.0, 0.0

    # ------------------------------------------------------------------------------------------------ weights

    def push_weights(self) -> None:
        """Collective under FSDP2 (every rank gathers every tensor); every rank's sampler gets the full weights."""
        if self.client is None:
            return
        weights = {name: _full(p.detach()) for name, p in self.model.named_parameters()}
        version = self.client.update_weights(weights, version=self.step)
        if version != self.step:
            raise RuntimeError(f"the sampler reports weight version {version} after a push of version {self.step}")

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.push_weights()  # resume: load_model_state_dict ran first, so the sampler gets the restored weights

    def extra_state(self) -> dict:
        return {"health": self.health.state_dict()}

    def load_extra_state(self, state: dict) -> None:
        self.health.load_state_dict(state.get("health", {}))
