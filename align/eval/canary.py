"""The canary: verifier-judged accuracy of the live policy on a fixed prompt set, through the sampler itself.

`evaluate` decodes each prompt greedily (pass@1) and, when asked, draws n samples at a temperature for the unbiased
pass@k (align.eval.metrics.pass_at_k); it also reports the stop rate
(completions that ended with EOS rather than at the token limit). With several ranks each rank takes rows
r, r + W, ... and the counts are summed, so every rank returns the same numbers.

`Canary` runs it every `every` optimizer steps as a Trainer callback (columns `canary/pass@1`, `canary/stop_rate`,
NaN on other steps so every history row has the same columns); with `halt_below` set it asks for a halt when pass@1
falls below that absolute level after `halt_after_step` steps. The GRPO stage also calls `evaluate` on the held-out
split for the starting and the final weights (the receipt's accuracy)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from align.eval.metrics import pass_at_k
from align.inference.config import SamplingParams
from align.inference.sequence import derive_seed
from align.rollout.protocol import RolloutRequest
from align.train.callbacks import Callback
from align.utils.dist import all_reduce_sum, rank, world_size


@dataclass(frozen=True)
class CanaryConfig:
    """[canary] table."""

    every: int = 0  # optimizer steps between canary runs (0: off)
    rows: int = 32  # the first N rows of the held-out prompt set
    pass_k: int = 0  # k of pass@k (0: greedy pass@1 only)
    pass_n: int = 8  # samples per prompt for pass@k (n >= k)
    temperature: float = 1.0  # for the pass@k samples
    halt_below: float | None = None  # pass@1 floor (absolute) that halts the run; None: report only
    halt_after_step: int = 0

    def __post_init__(self):
        if self.every < 0 or self.rows < 1 or self.pass_k < 0:
            raise ValueError("CanaryConfig: every >= 0, rows >= 1 and pass_k >= 0 required")
        if self.pass_k and self.pass_n < self.pass_k:
            raise ValueError(f"CanaryConfig: pass_n ({self.pass_n}) must be >= pass_k ({self.pass_k})")


@dataclass(frozen=True)
class EvalTask:
    """The prompts and how to judge them: ids(row), gold(row), decode(ids) and the verifier's reward(text, gold);
    group(row) (a difficulty level) when the results are wanted per group too."""

    ids: Callable[[int], tuple[int, ...]]
    gold: Callable[[int], str]
    decode: Callable[[list[int]], str]
    judge: Callable[[str, str], bool]
    eos_id: int
    group: Callable[[int], str] | None = None


def evaluate(client, task: EvalTask, rows: Sequence[int], max_new_tokens: int, pass_k: int = 0, pass_n: int = 0,
             temperature: float = 1.0, seed: int = 0) -> dict[str, float]:
    """{"pass@1", "stop_rate", "n"[, "pass@k"][, "pass@1_by_group"]} over `rows` (summed over ranks).
    "pass@1_by_group" (group -> greedy accuracy) when the task has groups."""
    mine = list(rows)[rank()::world_size()]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, stop_token_ids=(task.eos_id,))
    out = client.generate([RolloutRequest(task.ids(r), 1, greedy, request_id=r) for r in mine]).results
    right = {o.request_id: task.judge(task.decode(list(o.completion_ids)), task.gold(o.request_id)) for o in out}
    correct = sum(right.values())
    stopped = sum(o.finish_reason == "stop" for o in out)
    pk = 0.0
    if pass_k:
        params = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, stop_token_ids=(task.eos_id,))
        reqs = [RolloutRequest(task.ids(r), pass_n, params, seed=derive_seed(seed, r), request_id=r) for r in mine]
        hits: dict[int, int] = {r: 0 for r in mine}
        for o in client.generate(reqs).results:
            hits[o.request_id] += int(task.judge(task.decode(list(o.completion_ids)), task.gold(o.request_id)))
        pk = sum(pass_at_k(pass_n, c, pass_k) for c in hits.values())
    n, correct, stopped, pk = all_reduce_sum([len(mine), correct, stopped, pk]).tolist()
    result = {"pass@1": correct / n if n else math.nan, "stop_rate": stopped / n if n else math.nan, "n": n}
    if pass_k:
        result[f"pass@{pass_k}"] = pk / n if n else math.nan
    result["right"] = _right_vector(list(rows), right)
    if task.group is not None:
        result["pass@1_by_group"] = _by_group(task.group, list(rows), result["right"])
    return result


def _right_vector(rows: list[int], right: dict[int, bool]) -> list[int]:
    """1/0 per row of `rows` (in that order), over all ranks: what a paired comparison of two evaluations needs."""
    slot = {r: i for i, r in enumerate(rows)}
    vec = torch.zeros(len(rows), dtype=torch.float64)
    for r, ok in right.items():
        vec[slot[r]] = float(ok)
    return [int(v) for v in all_reduce_sum(vec).tolist()]


def paired_gain(before: dict, after: dict) -> dict[str, float]:
    """The accuracy gain between two evaluations of the same rows with its paired standard error and 95% interval
    (normal approximation on the per-row differences; a row right in both or wrong in both adds no variance)."""
    a, b = before["right"], after["right"]
    if len(a) != len(b) or not a:
        raise ValueError(f"paired_gain: evaluations of {len(a)} and {len(b)} rows")
    diffs = [y - x for x, y in zip(a, b)]
    n = len(diffs)
    mean = sum(diffs) / n
    var = sum((d - mean) ** 2 for d in diffs) / (n - 1) if n > 1 else 0.0
    se = math.sqrt(var / n)
    return {"accuracy_gain_se": se, "accuracy_gain_ci95": [mean - 1.96 * se, mean + 1.96 * se],
            "rows_gained": sum(d > 0 for d in diffs), "rows_lost": sum(d < 0 for d in diffs)}


def _by_group(group: Callable[[int], str], rows: list[int], right: list[int]) -> dict[str, float]:
    """Greedy accuracy per group from the all-ranks right/wrong vector (`right[i]` is row `rows[i]`)."""
    hits: dict[str, list[int]] = {}
    for r, ok in zip(rows, right):
        hits.setdefault(group(r), []).append(ok)
    return {g: sum(v) / len(v) for g, v in sorted(hits.items())}


class Canary(Callback):
    name = "canary"

    def __init__(self, cfg: CanaryConfig, client, task: EvalTask, max_new_tokens: int, seed: int = 0):
        self.cfg, self.client, self.task, self.max_new_tokens, self.seed = cfg, client, task, max_new_tokens, seed
        self.rows = list(range(cfg.rows))
        self.keys = ["canary/pass@1", "canary/stop_rate"] + ([f"canary/pass@{cfg.pass_k}"] if cfg.pass_k else [])

    def observe(self, trainer, metrics: dict) -> str | None:
        for key in self.keys:
            metrics[key] = math.nan
        if not self.cfg.every or trainer.step % self.cfg.every:
            return None
        result = evaluate(self.client, self.task, self.rows, self.max_new_tokens, self.cfg.pass_k, self.cfg.pass_n,
                          self.cfg.temperature, derive_seed(self.seed, trainer.step))
        for key in self.keys:
            metrics[key] = result[key.split("/", 1)[1]]
        floor = self.cfg.halt_below
        if floor is not None and trainer.step >= self.cfg.halt_after_step and result["pass@1"] < floor:
            return f"canary pass@1 {result['pass@1']:.3f} below {floor} at step {trainer.step}"
        return None
