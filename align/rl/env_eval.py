"""Greedy evaluation through an environment: what an RL stage with `[environment]` reports before and after training.

A policy that calls a tool is judged by the episode, not by its first turn: a single-turn greedy decode of a
calculator caller ends at its tool call and holds no answer. `evaluate_episodes` runs one greedy episode per row
(align.rl.environment.run_episodes at temperature 0, the stage's turn and token budgets, the same observation path
as the rollouts) and returns align.eval.canary.evaluate's keys (`pass@1`, `stop_rate`, `n`, `right`,
`pass@1_by_group`: the receipt's accuracy block and paired gain read them unchanged) plus the tool's use:

    tool_call_rate    episodes with at least one call (an observation appended)
    mean_calls        calls per episode
    call_parse_rate   calls the environment could answer (a parsed, computable call; not `<result>error</result>`),
                      over all calls (NaN without calls)
                      (each of the three also per group, `<key>_by_group`: the level of the bundled tasks)
    accuracy_with_call / accuracy_without_call   pass@1 of the episodes that called / did not (NaN when none)

`EnvReceiptEvals` is align.rl.report.ReceiptEvals with the held-out (and trained-prompt) evaluations run this way;
`env_receipt` is the block its `receipt_extras` adds to metrics.json: each of the numbers above before and after
(`start_*`), per level, and the in-loop curve of the rollouts' tool-call rate (`rollout/tool_call_rate` of
history.jsonl, the sampled policy's share of episodes that called, first and last stretch as the reward curve). Rows are
split over ranks (rank r takes rows r, r + W, ...) and the per-row numbers summed, so every rank returns the same
dict."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from align.eval.prompts import PromptSet
from align.rl.environment import ENVIRONMENTS, Environment, EpisodeStart, episode_kwargs, run_episodes
from align.rl.report import ReceiptEvals, reward_curve
from align.utils.dist import all_reduce_sum, rank, world_size

COLUMNS = ("right", "stopped", "called", "calls", "failed")  # per-row numbers summed over ranks


@dataclass(frozen=True)
class EpisodeEval:
    """How to run and judge one greedy episode per row: run_episodes' keyword arguments (`episode_kwargs`: encode,
    decode, eos_id, newline_ids, max_tokens, max_turns, tool_turns) and the verifier's judge(text, gold)."""

    make_env: Callable[[], Environment]
    episode_kwargs: dict
    judge: Callable[[str, str], bool]


def evaluate_episodes(client, prompts: PromptSet, rows: range, spec: EpisodeEval) -> dict:
    """Greedy episodes of `rows` (module doc); collective over ranks."""
    rows = list(rows)
    mine = rows[rank()::world_size()]
    envs: list = []

    def make_env() -> Environment:  # keep each episode's environment: its call counts are read after the run
        envs.append(spec.make_env())
        return envs[-1]

    decode = spec.episode_kwargs["decode"]
    starts = [EpisodeStart(tuple(prompts.ids(r)), decode(list(prompts.ids(r))),
                           prompts.meta(r) if prompts.meta else {"gold": prompts.gold(r)}, seed=0) for r in mine]
    episodes = run_episodes(client, starts, make_env, temperature=0.0, **spec.episode_kwargs) if starts else []
    table = torch.zeros(len(rows), len(COLUMNS), dtype=torch.float64)
    slot = {r: i for i, r in enumerate(rows)}
    for r, ep, env in zip(mine, episodes, envs):
        right = spec.judge(decode(list(ep.completion_ids)), prompts.gold(r))
        calls, failed = float(getattr(env, "calls", ep.turns)), float(getattr(env, "failed", 0))
        table[slot[r]] = torch.tensor([float(right), float(ep.finish_reason == "stop"), float(ep.turns > 0), calls,
                                       failed], dtype=torch.float64)
    table = all_reduce_sum(table).reshape(len(rows), len(COLUMNS))
    return summarise(table, rows, [prompts.groups[int(r)] for r in rows])


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _parse_rate(col: dict[str, list[float]], rows) -> float:
    calls = sum(col["calls"][i] for i in rows)
    return (calls - sum(col["failed"][i] for i in rows)) / calls if calls else math.nan


def summarise(table: torch.Tensor, rows: list[int], groups: list[str]) -> dict:
    """The per-row table (COLUMNS) -> the evaluation's dict (module doc)."""
    col = {name: table[:, j].tolist() for j, name in enumerate(COLUMNS)}
    right = [int(v) for v in col["right"]]
    with_call = [ok for ok, c in zip(right, col["called"]) if c]
    without = [ok for ok, c in zip(right, col["called"]) if not c]
    by_group: dict[str, list[int]] = {}
    for i, g in enumerate(groups):
        by_group.setdefault(g, []).append(i)

    def per_group(stat: Callable[[list[int]], float]) -> dict[str, float]:  # stat over each group's row indices
        return {g: stat(ix) for g, ix in sorted(by_group.items())}

    def mean_of(values: list[float]) -> Callable[[list[int]], float]:
        return lambda ix: _mean([values[i] for i in ix])

    return {"pass@1": _mean(right), "stop_rate": _mean(col["stopped"]), "n": len(rows), "right": right,
            "pass@1_by_group": per_group(mean_of(right)),
            "tool_call_rate": _mean(col["called"]), "tool_call_rate_by_group": per_group(mean_of(col["called"])),
            "mean_calls": _mean(col["calls"]), "mean_calls_by_group": per_group(mean_of(col["calls"])),
            "call_parse_rate": _parse_rate(col, range(len(rows))),
            "call_parse_rate_by_group": per_group(lambda ix: _parse_rate(col, ix)),
            "accuracy_with_call": _mean(with_call), "accuracy_without_call": _mean(without)}


class EnvReceiptEvals:
    """ReceiptEvals' evaluations as greedy episodes (module doc); `results` keeps every call's output, so the receipt
    can hold `env_receipt(results[0], results[-1], history)`."""

    def __init__(self, base: ReceiptEvals, client, heldout: PromptSet, trained: PromptSet | None, spec: EpisodeEval):
        self.base, self.client, self.spec = base, client, spec
        self.prompts = {"heldout": (heldout, base.heldout_rows)}
        if base.trained is not None and trained is not None:
            self.prompts["trained"] = (trained, base.trained_rows)
        self.heldout = base.heldout  # the canary's single-turn task (align.eval.canary.Canary reads it)
        self.results: list[dict[str, dict]] = []

    def __call__(self) -> dict[str, dict]:
        out = {name: evaluate_episodes(self.client, prompts, rows, self.spec)
               for name, (prompts, rows) in self.prompts.items()}
        self.results.append(out)
        return out

    def receipt_extras(self, run_dir: Path, label: str) -> dict:
        """The receipt's `environment` block (env_receipt of the first and the last evaluation) and its summary line;
        align.rl.report.fit_with_receipt writes it into metrics.json with the rest."""
        block = env_receipt(self.results[0], self.results[-1], run_dir / "history.jsonl")
        print(f"{label}: held-out greedy episodes: tool-call rate {block['start_tool_call_rate']:.3f} -> "
              f"{block['tool_call_rate']:.3f}, calls that parse {block['start_call_parse_rate']:.3f} -> "
              f"{block['call_parse_rate']:.3f}; rollout tool-call rate {block['rollout_tool_call_rate_first']:.3f} -> "
              f"{block['rollout_tool_call_rate_last']:.3f}")
        return {"environment": block}


ENV_KEYS = ("tool_call_rate", "tool_call_rate_by_group", "mean_calls", "mean_calls_by_group", "call_parse_rate",
            "call_parse_rate_by_group", "accuracy_with_call", "accuracy_without_call")


def env_receipt(before: dict[str, dict], after: dict[str, dict], history: str | os.PathLike) -> dict:
    """The `environment` block of an RL stage's metrics.json: ENV_KEYS of the held-out episodes before (`start_*`)
    and after, the same for the trained prompts (`trained_*`) when evaluated, and the rollouts' tool-call rate curve."""
    out = {}
    for split, prefix in (("heldout", ""), ("trained", "trained_")):
        if split in before and split in after:
            for key in ENV_KEYS:
                out[f"{prefix}start_{key}"] = before[split][key]
                out[f"{prefix}{key}"] = after[split][key]
    curve = reward_curve(history, key="rollout/tool_call_rate")
    out.update({"rollout_tool_call_rate_first": curve["reward_first"],
                "rollout_tool_call_rate_last": curve["reward_last"],
                "rollout_tool_call_rate_points": curve["reward_points"]})
    return out


def env_receipt_evals(cfg, base: ReceiptEvals, client, tok, heldout: PromptSet,
                      trained: PromptSet | None) -> EnvReceiptEvals:
    """The receipt's evaluations of a stage with `[environment]` (`cfg`: its RolloutStageConfig): greedy episodes
    under the rollouts' own environment, turn and token budgets and observation path, judged as the single-turn
    evaluation judges (`base.heldout.judge`: the verifier)."""
    spec = EpisodeEval(ENVIRONMENTS[cfg.environment.name], episode_kwargs(cfg.environment, tok, cfg.shape),
                       base.heldout.judge)
    return EnvReceiptEvals(base, client, heldout, trained, spec)
