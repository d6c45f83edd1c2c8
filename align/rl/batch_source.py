"""`GrpoBatchSource`: the GRPO stage's loader. Samples rollouts, scores them, and yields optimizer-step windows.

Per rollout (this rank's share: P / world_size prompts x G samples):
    1. prompts from the seeded curriculum (align.rl.curriculum); one RolloutRequest per prompt, G samples, each with
       a seed derived from (run seed, rollout, round, row), so the samples are a pure function of the weights
    2. every result's weight version must equal the policy's current version (the engine must sample from what is
       being trained; a mismatch is a bug in the weight push and raises)
    3. rewards (align.rl.rewards.CompositeReward); a group with an invalid sample (unreadable gold, sampler error) is
       dropped; with dynamic sampling a group whose rewards are all equal is dropped too (and one solved more often
       than `max_pass_rate`), and fresh prompts top the rollout up, for at most `max_rounds` more rounds; still
       short, the dropped groups fill the gap, too-easy ones first (a zero-variance group's advantages are 0: it
       adds no gradient, but every rank keeps the same number of micro-batches)
       (`rollout/reward_sum` / `rollout/samples` count every valid group generated, kept or dropped: the policy's
       reward on fresh prompts, unbiased by the filter, which the receipt's reward curve reads)
    4. the reference's log-probs when the loss or the reward has a KL term; advantages per group
       (align.rl.advantages); with `[step_credit]`, per-token step advantages on equation results
       (align.rl.step_credit); `num_minibatches` windows (align.rl.assembly)
    5. `old_logprobs = "recompute"`: the training model's log-probs at the rollout's weights (the exact pi_old of
       the ratio, and rho's numerator): the first window's come from its own training forward (flag
       `old_from_forward`); every row that trains later (later minibatches, later epochs) is scored once, now
    6. with a `skip_rows` rule (`[loss] zero_gradient_rows = "skip"`, align.rl.zero_rows) the rows whose loss and
       gradient are exactly 0 leave the micro-batches before step 5 (so they are not scored either); each window's
       first micro-batch carries them as `skipped` (their loss units and row counts, no forward). The micro-batch
       and scoring-pass counts are agreed by every rank (one MAX all-reduce each), so the collectives still match.
A window whose rollout is staler than `max_staleness` optimizer steps when it comes up is trained
(`on_stale = "correct"`: the ratio and rho account for it) or dropped with the rest of its rollout ("refuse").

Resume: `state_dict()` after a step holds the curriculum position, the rollout counter and the windows of the current
rollout not yet trained (tensors), so a resumed run trains exactly the batches an uninterrupted one would."""

from __future__ import annotations

import time
from typing import Callable, Iterator

import torch

from align.exceptions import DataError
from align.inference.config import SamplingParams
from align.inference.sequence import derive_seed
from align.rl.advantages import AdvantageConfig, group_advantages, zero_variance
from align.rl.assembly import assemble, plan_windows, row_lengths, select_rows, window_seed
from align.rl.curriculum import PromptCurriculum
from align.eval.prompts import PromptSet  # also imported from here by the stages and tests
from align.rl.environment import EpisodeRunner, EpisodeStart
from align.rl.reward_models import score_model_terms
from align.rl.reward_terms import TermInput
from align.rl.rewards import CompositeReward
from align.rl.stage_config import DynamicSamplingConfig, RolloutShape
from align.rl.step_credit import StepCreditConfig, step_advantages
from align.rl.types import Group, ScoredSample
from align.rl.zero_rows import RowRule, cut_window, micro_count, skipped_rows, split_window
from align.rollout.protocol import RolloutClient, RolloutRequest
from align.utils.dist import all_reduce_max

STATE_VERSION = 1
STAT_KEYS = ("rollout/gen_s", "rollout/score_s", "rollout/gen_tokens", "rollout/groups_generated",
             "rollout/groups_kept", "rollout/groups_zero_var", "rollout/groups_easy", "rollout/groups_filled",
             "rollout/groups_invalid",
             "rollout/rounds", "rollout/refused_windows", "rollout/ranks", "rollout/reward_sum",
             "rollout/samples")
MAX_FILL_ROUNDS = 50  # bound on extra rounds when too few groups are valid at all (unreadable golds everywhere)

Scorer = Callable[[dict], torch.Tensor]  # micro-batch -> (N, C) log-probs at the sampling temperature


def attach_stats(windows: list[list[dict]], stats: dict[str, float]) -> None:
    """The rollout's own numbers ride on its first step's first micro-batch; the later steps carry zeros for the
    same columns (and `rollout/ranks` 1, the per-rank divisor of the timings)."""
    zeros = {**{k: 0.0 for k in STAT_KEYS}, **{k: 0.0 for k in stats}, "rollout/ranks": 1.0}
    for j, window in enumerate(windows):
        window[0]["stats"] = stats if j == 0 else dict(zeros)


class GrpoBatchSource:
    def __init__(self, prompts: PromptSet, client: RolloutClient, decode: Callable[[list[int]], str],
                 reward: CompositeReward, curriculum: PromptCurriculum, shape: RolloutShape,
                 dynamic: DynamicSamplingConfig, advantage: AdvantageConfig, *, seed: int, eos_id: int,
                 policy_version: Callable[[], int], old_scorer: Scorer | None = None,
                 ref_scorer: Scorer | None = None, world_size: int = 1, skip_rows: RowRule | None = None,
                 step_credit: StepCreditConfig = StepCreditConfig(), episodes: EpisodeRunner | None = None):
        self.prompts, self.client, self.decode, self.reward = prompts, client, decode, reward
        self.curriculum, self.shape, self.dynamic, self.advantage = curriculum, shape, dynamic, advantage
        self.seed, self.policy_version = seed, policy_version
        self.old_scorer, self.ref_scorer = old_scorer, ref_scorer
        self.skip_rows = skip_rows  # None: every row trains (PPO, and `zero_gradient_rows = "train"`)
        self.step_credit = step_credit
        self.episodes = episodes  # multi-turn rollouts (align.rl.environment); None: one completion per sample
        self.local_prompts = shape.check_world(world_size)
        self.params = SamplingParams(temperature=shape.temperature, max_new_tokens=shape.max_new_tokens,
                                     stop_token_ids=(eos_id,))
        if shape.old_logprobs == "recompute" and old_scorer is None:
            raise ValueError("GrpoBatchSource: old_logprobs = 'recompute' needs old_scorer")
        if reward.needs_reference and ref_scorer is None:
            raise ValueError("GrpoBatchSource: reward KL shaping needs ref_scorer")
        self.rollouts = 0  # rollouts sampled so far (the seed stream's clock)
        self.refused = 0
        self.pending: list[list[dict]] = []  # windows of the current rollout not yet yielded

    # ------------------------------------------------------------------------------------------------ iteration
    def __iter__(self) -> Iterator[list[dict]]:
        while True:
            if not self.pending:
                self.pending = self._rollout()
            window = self.pending.pop(0)  # advance before yielding: state_dict() after the step resumes past it
            lag = self.policy_version() - int(window[0]["weight_version"][0])
            if lag > self.shape.staleness_bound and self.shape.on_stale == "refuse":
                self.refused += 1 + len(self.pending)
                self.pending = []
                continue
            yield window

    def _rollout(self) -> list[list[dict]]:
        t0 = time.perf_counter()
        groups, counts = self._sample_groups()
        gen_s = time.perf_counter() - t0
        advantages = torch.zeros(len(groups), self.shape.samples)
        batch = assemble(groups, advantages, self.shape.truncated)
        t1 = time.perf_counter()
        if self.ref_scorer is not None:
            batch["ref_logprobs"] = self._score(batch, self.ref_scorer)
            if self.reward.needs_reference:
                groups = self._shape_with_kl(groups, batch)
        rewards = torch.tensor([g.totals for g in groups], dtype=torch.float64)
        batch["rewards"] = rewards.reshape(-1).float()
        batch["advantages"] = group_advantages(rewards, self.advantage).reshape(-1).float()
        if self.step_credit.enabled:
            batch["step_advantages"] = step_advantages([[s.completion_ids for s in g.samples] for g in groups],
                                                       self.decode, self.step_credit, batch["completion_ids"].shape[1])
        shape = self.shape
        plan = plan_windows(row_lengths(batch), shape.num_minibatches, shape.micro_batch_size,
                            window_seed(self.seed, self.rollouts), shape.epochs)
        left_out = [None] * len(plan)
        if self.skip_rows is not None:
            plan, left_out = self._trim(plan, self.skip_rows(batch))
        if self.old_scorer is not None:  # every row that trains after the first step: scored now, once
            later = torch.cat([rows for window in plan[1:] for rows in window]).unique() if len(plan) > 1 else None
            if later is not None:
                passes = None
                if self.skip_rows is not None:  # ranks score different row counts now: agree on the passes
                    passes = int(all_reduce_max([micro_count(later.numel(), shape.micro_batch_size)])[0])
                batch["old_logprobs"][later] = self._score(select_rows(batch, later), self.old_scorer,
                                                           batch["old_logprobs"].shape[1], passes)
        windows = [[select_rows(batch, rows) for rows in window] for window in plan]
        for window, rows in zip(windows, left_out):
            if rows is not None and rows.numel():
                window[0]["skipped"] = skipped_rows(batch, rows)
        if self.old_scorer is not None:
            for mb in windows[0]:  # trains on exactly the weights that sampled it: pi_old is its own forward
                mb["old_from_forward"] = True
        score_s = time.perf_counter() - t1
        stats = {**counts, "rollout/gen_s": gen_s, "rollout/score_s": score_s, "rollout/refused_windows":
                 float(self.refused), "rollout/ranks": 1.0}
        self.rollouts += 1
        self.refused = 0
        attach_stats(windows, stats)
        return windows

    # ------------------------------------------------------------------------------------------------ sampling
    def _sample_groups(self) -> tuple[list[Group], dict[str, float]]:
        need, kept, easy, dropped = self.local_prompts, [], [], []
        counts = dict.fromkeys(("rollout/groups_generated", "rollout/groups_zero_var", "rollout/groups_easy",
                                "rollout/groups_invalid",
                                "rollout/gen_tokens", "rollout/reward_sum", "rollout/samples"), 0.0)
        for label in self.reward.labels:  # per-term sums over the same samples as reward_sum, and failures
            counts[f"rollout/term_sum/{label}"] = counts[f"rollout/term_failures/{label}"] = 0.0
        if self.episodes is not None:  # multi-turn: observations (tool answers) and samples with at least one
            counts["rollout/env_turns"] = counts["rollout/env_samples_with_turns"] = 0.0
        rounds = 0
        while len(kept) < need:
            filtering = self.dynamic.enabled and rounds <= self.dynamic.max_rounds
            if not filtering and len(kept) + len(easy) + len(dropped) >= need:
                break
            if rounds > self.dynamic.max_rounds + MAX_FILL_ROUNDS:
                have = len(kept) + len(easy) + len(dropped)
                raise DataError(f"GRPO rollout {self.rollouts}: only {have} of {need} prompt "
                                f"groups were valid after {rounds} rounds (unreadable gold answers or sampler errors)")
            for g in self._generate(self.curriculum.take(need - len(kept)), rounds):
                counts["rollout/groups_generated"] += 1
                counts["rollout/gen_tokens"] += sum(len(s.completion_ids) for s in g.samples)
                self.curriculum.record(g.prompt_row, g.all_correct)
                if g.valid:  # every valid group, kept or dropped: the policy's reward on fresh prompts
                    counts["rollout/reward_sum"] += sum(g.totals)
                    counts["rollout/samples"] += len(g.samples)
                    for s in g.samples:
                        for label, value in s.reward.terms:
                            counts[f"rollout/term_sum/{label}"] += value
                        if self.episodes is not None:
                            counts["rollout/env_turns"] += s.turns
                            counts["rollout/env_samples_with_turns"] += float(s.turns > 0)
                for s in g.samples:
                    for label in s.reward.failures:
                        counts[f"rollout/term_failures/{label}"] += 1.0
                if not g.valid:
                    counts["rollout/groups_invalid"] += 1
                elif filtering and bool(zero_variance(torch.tensor([g.totals]))[0]):
                    counts["rollout/groups_zero_var"] += 1
                    dropped.append(g)
                elif filtering and g.pass_rate > self.dynamic.max_pass_rate:
                    counts["rollout/groups_easy"] += 1
                    easy.append(g)
                else:
                    kept.append(g)
            rounds += 1
        fill = max(0, need - len(kept))
        counts.update({"rollout/groups_kept": float(len(kept)), "rollout/groups_filled": float(fill),
                       "rollout/rounds": float(rounds)})
        return kept + (easy + dropped)[:fill], counts  # an easy group still has a gradient: it fills first

    def _generate(self, rows: list[int], round_: int) -> list[Group]:
        if self.episodes is not None:
            return self._generate_episodes(rows, round_)
        requests = [RolloutRequest(self.prompts.ids(row), self.shape.samples, self.params,
                                   seed=derive_seed(self.seed, self.rollouts, round_, row), request_id=row)
                    for row in rows]
        batch = self.client.collect(self.client.submit(requests))
        version = self.policy_version()
        by_row: dict[int, list[ScoredSample]] = {row: [] for row in rows}
        for res in batch.results:
            if res.weight_version != version:
                raise RuntimeError(f"GRPO rollout {self.rollouts}: a sample came from weight version "
                                   f"{res.weight_version}, the policy is at {version}; the engine was not updated")
        meta = self.prompts.meta or (lambda row: {})
        items = [TermInput(self.decode(list(res.completion_ids)), self.prompts.gold(res.request_id),
                           len(res.completion_ids), res.finish_reason,
                           self.decode(list(res.prompt_ids)) if self.reward.needs_prompt else "",
                           meta(res.request_id)) for res in batch.results]
        for res, reward in zip(batch.results, self.reward.score_many(items)):
            by_row[res.request_id].append(ScoredSample(res.request_id, res.prompt_ids, res.completion_ids,
                                                       res.logprobs, res.finish_reason, res.weight_version, reward))
        groups = [Group(row, tuple(by_row[row])) for row in rows]
        return score_model_terms(groups, self.reward, self.shape.micro_batch_size)

    def _generate_episodes(self, rows: list[int], round_: int) -> list[Group]:
        """G multi-turn episodes per row (align.rl.environment.run_episodes), each seeded by (run seed, rollout,
        round, row, sample); scored by the [reward] terms on the whole completion; the environment's observation
        tokens carry `policy_mask` 0 (out of the loss)."""
        meta = self.prompts.meta or (lambda row: {})
        starts = [EpisodeStart(tuple(self.prompts.ids(row)), self.decode(list(self.prompts.ids(row))), meta(row),
                               derive_seed(self.seed, self.rollouts, round_, row, k))
                  for row in rows for k in range(self.shape.samples)]
        episodes = self.episodes(starts)
        version = self.policy_version()
        items, finishes = [], []
        for j, (start, ep) in enumerate(zip(starts, episodes)):
            if ep.weight_version != version:
                raise RuntimeError(f"GRPO rollout {self.rollouts}: an episode came from weight version "
                                   f"{ep.weight_version}, the policy is at {version}; the engine was not updated")
            finish = {"stop": "stop", "error": "error"}.get(ep.finish_reason, "length")  # a budget cut: "length"
            finishes.append(finish)
            gold = self.prompts.gold(rows[j // self.shape.samples])
            items.append(TermInput(self.decode(list(ep.completion_ids)), gold, int(sum(ep.policy_mask)), finish,
                                   start.prompt if self.reward.needs_prompt else "", start.meta))
        rewards = self.reward.score_many(items)
        groups = []
        for r, row in enumerate(rows):
            samples = []
            for k in range(self.shape.samples):
                j = r * self.shape.samples + k
                ep = episodes[j]
                samples.append(ScoredSample(row, starts[j].prompt_ids, ep.completion_ids, ep.logprobs, finishes[j],
                                            ep.weight_version, rewards[j], ep.policy_mask, ep.turns))
            groups.append(Group(row, tuple(samples)))
        return score_model_terms(groups, self.reward, self.shape.micro_batch_size)

    def _trim(self, plan: list[list[torch.Tensor]], dropped: torch.Tensor
              ) -> tuple[list[list[torch.Tensor]], list[torch.Tensor]]:
        """The plan without the rows `dropped` marks (align.rl.zero_rows), and each window's rows left out. Every
        rank takes the same number of micro-batches per window: the MAX over ranks of what its kept rows need."""
        parts = [split_window(window, dropped) for window in plan]
        counts = all_reduce_max([micro_count(kept.numel(), self.shape.micro_batch_size) for kept, _ in parts])
        cut = [cut_window(kept, out, int(n)) for (kept, out), n in zip(parts, counts.tolist())]
        return [micro for micro, _ in cut], [out for _, out in cut]

    # ------------------------------------------------------------------------------------------------ scoring
    def _score(self, batch: dict, scorer: Scorer, width: int | None = None, passes: int | None = None
               ) -> torch.Tensor:
        """(N, width) log-probs of a batch's rows, scored in micro-batches (longest first, little padding);
        `passes`: exactly that many scoring forwards (>= the rows' micro_count; agreed by every rank), the rows cut
        evenly, a pass left without a row scoring the shortest one again (discarded)."""
        out = torch.zeros(batch["completion_ids"].shape[0], width or batch["completion_ids"].shape[1])
        order = torch.sort(row_lengths(batch), descending=True, stable=True).indices
        chunks = order.split(self.shape.micro_batch_size) if passes is None else torch.tensor_split(order, passes)
        for rows in chunks:
            if rows.numel() == 0:  # NOTE: the forward is a collective under FSDP2; its result is not needed
                scorer(select_rows(batch, order[-1:]))
                continue
            part = select_rows(batch, rows)
            scored = scorer(part).float().cpu()
            out[rows, :scored.shape[1]] = scored * part["completion_mask"]
        return out

    def _shape_with_kl(self, groups: list[Group], batch: dict) -> list[Group]:
        """Rewards after KL shaping: seq_kl = sum_t (rollout - ref) over the completion, per sample (the sampler's
        log-probs stand for the policy's: pi_old is not known for every row before the windows are cut)."""
        seq_kl = ((batch["rollout_logprobs"] - batch["ref_logprobs"]) * batch["completion_mask"]).sum(1).tolist()
        it = iter(seq_kl)
        return [Group(g.prompt_row, tuple(ScoredSample(s.prompt_row, s.prompt_ids, s.completion_ids,
                                                       s.rollout_logprobs, s.finish_reason, s.weight_version,
                                                       self.reward.with_kl(s.reward, next(it)))
                                          for s in g.samples)) for g in groups]

    # ------------------------------------------------------------------------------------------------ resume
    def state_dict(self) -> dict:
        return {"version": STATE_VERSION, "curriculum": self.curriculum.state_dict(), "rollouts": self.rollouts,
                "refused": self.refused, "pending": [list(window) for window in self.pending]}  # a snapshot

    def load_state_dict(self, state: dict) -> None:
        if state.get("version") != STATE_VERSION:
            raise DataError(f"GRPO batch source state version {state.get('version')!r}, this code reads "
                            f"{STATE_VERSION}")
        self.curriculum.load_state_dict(state["curriculum"])
        self.rollouts, self.refused = int(state["rollouts"]), int(state["refused"])
        self.pending = [[dict(mb) for mb in window] for window in state["pending"]]
