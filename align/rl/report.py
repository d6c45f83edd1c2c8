"""The reward curve of a GRPO run, summarised from its `history.jsonl` for the receipt.

The curve is `rollout/reward_mean` by default: the sampled policy's mean reward over every valid group a rollout
generated, kept or dropped by dynamic sampling, logged on the step that sampled it (NaN, hence skipped, on the other
steps). The trained rows' `reward_mean` is a poor learning curve: dynamic sampling keeps mixed groups and fills with
all-wrong ones, so it measures the filter as much as the policy.
`reward_first` / `reward_last`: the mean over the first and the last `fraction` of the logged points (single rows are
noisy); `reward_slope`: the least-squares slope against the step (reward per step); `reward_rising` is
reward_last > reward_first; `reward_key` names the column, `reward_points` counts its logged points, `steps` the
history's rows.

`ReceiptEvals` runs the greedy evaluations the receipt compares before and after training: the held-out split, and
with `[data] train_eval_rows` = N the first N of the RL prompts the stage trains on, so the receipt shows how much
of the gain stays on the prompts the policy saw (`trained_*`) against what reaches new ones (docs/MEASUREMENTS.md,
ladder, 2026-12-04: +14 points on the tiny profile's own prompts, +2 held-out)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from align.data.store import ShardSet
from align.eval.inloop import verifier_task
from align.eval.canary import EvalTask, evaluate, paired_gain
from align.rl.stage_config import GrpoDataConfig
from align.utils.dist import is_rank0
from align.utils.fsio import atomic_write_json
from align.utils.tracking import read_history


def reward_curve(history: str | os.PathLike, fraction: float = 0.25, key: str = "rollout/reward_mean") -> dict:
    history = read_history(history)
    rows = [(r["step"], r[key]) for r in history if isinstance(r.get(key), (int, float))]
    if not rows:
        return {"reward_first": math.nan, "reward_last": math.nan, "reward_slope": math.nan, "reward_rising": False,
                "steps": len(history), "reward_points": 0, "reward_key": key}
    k = max(1, int(len(rows) * fraction))
    first = sum(v for _, v in rows[:k]) / k
    last = sum(v for _, v in rows[-k:]) / k
    mx = sum(s for s, _ in rows) / len(rows)
    my = sum(v for _, v in rows) / len(rows)
    var = sum((s - mx) ** 2 for s, _ in rows)
    slope = sum((s - mx) * (v - my) for s, v in rows) / var if var else 0.0
    return {"reward_first": first, "reward_last": last, "reward_slope": slope, "reward_rising": last > first,
            "steps": len(history), "reward_points": len(rows), "reward_key": key}


TERM_MEAN, TERM_FAILURES = "rollout/term_mean/", "rollout/term_failures/"


def reward_terms(history: str | os.PathLike, fraction: float = 0.25) -> dict[str, dict]:
    """Each reward term's unweighted mean (align.rl.reward_terms) over the run, from the history's
    `rollout/term_mean/<label>` columns: `mean` over every logged point, `first` / `last` over the first and the
    last `fraction` of them (as the reward curve), and `failures` (the term's failed calls, rewarded 0)."""
    history = read_history(history)
    labels = sorted({k.removeprefix(TERM_MEAN) for r in history for k in r if k.startswith(TERM_MEAN)})
    out = {}
    for label in labels:
        values = [r[TERM_MEAN + label] for r in history if isinstance(r.get(TERM_MEAN + label), (int, float))]
        k = max(1, int(len(values) * fraction))
        out[label] = {"mean": sum(values) / len(values) if values else math.nan,
                      "first": sum(values[:k]) / k if values else math.nan,
                      "last": sum(values[-k:]) / k if values else math.nan, "points": len(values),
                      "failures": sum(r.get(TERM_FAILURES + label) or 0.0 for r in history)}
    return out


class ReceiptEvaluator(Protocol):
    """What an RL stage's receipt evaluations provide (ReceiptEvals; align.rl.env_eval.EnvReceiptEvals): a collective
    call returning {"heldout": ..., ["trained": ...]}, the single-turn task the canary reads, and the blocks a kind of
    evaluation adds to metrics.json beyond heldout_receipt's."""

    heldout: EvalTask

    def __call__(self) -> dict[str, dict]: ...

    def receipt_extras(self, run_dir: Path, label: str) -> dict: ...


@dataclass(frozen=True)
class ReceiptEvals:
    """Greedy evaluations of the current weights (through `client`): {"heldout": ..., ["trained": ...]}, each
    align.eval.canary.evaluate's dict. Collective: every rank calls it at the same point."""

    client: object
    heldout: EvalTask
    heldout_rows: range
    trained: EvalTask | None
    trained_rows: range
    max_new_tokens: int

    def __call__(self) -> dict[str, dict]:
        out = {"heldout": evaluate(self.client, self.heldout, self.heldout_rows, self.max_new_tokens)}
        if self.trained is not None:
            out["trained"] = evaluate(self.client, self.trained, self.trained_rows, self.max_new_tokens)
        return out

    def receipt_extras(self, run_dir: Path, label: str) -> dict:
        """Blocks beyond heldout_receipt's that these evaluations add to metrics.json (rank 0, after the last call):
        none for single-turn ones (align.rl.env_eval.EnvReceiptEvals adds its `environment` block)."""
        return {}


def receipt_evals(data: GrpoDataConfig, client, heldout: ShardSet, prompts: ShardSet,
                  decode: Callable[[list[int]], str], eos_id: int) -> ReceiptEvals:
    n_train = min(data.train_eval_rows, len(prompts))
    return ReceiptEvals(client, verifier_task(heldout, decode, eos_id), range(min(data.eval_rows or len(heldout),
                                                                                 len(heldout))),
                        verifier_task(prompts, decode, eos_id) if n_train else None, range(n_train),
                        data.eval_max_new_tokens)


def heldout_receipt(before: dict[str, dict], after: dict[str, dict], start_checkpoint: str,
                    history: str | os.PathLike) -> dict:
    """An RL stage's metrics.json (the receipt's metrics), from ReceiptEvals before and after training: held-out
    greedy accuracy of the start and of the result, per level, the paired gain with its interval, stop rates, the
    start checkpoint's hash, the reward curve above, each reward term's means (`reward_terms`), and with
    trained-prompt evaluations the same accuracy block
    on them (`trained_*`). The GRPO and PPO stages' receipt."""
    b, a = before["heldout"], after["heldout"]
    out = {"heldout_rows": int(b["n"]), **accuracy_block(b, a), "start_stop_rate": b["stop_rate"],
           "stop_rate": a["stop_rate"], "start_checkpoint": start_checkpoint, **reward_curve(history),
           "reward_terms": reward_terms(history)}
    if "trained" in before:
        out.update({"trained_rows": int(before["trained"]["n"]),
                    **accuracy_block(before["trained"], after["trained"], "trained_")})
    return out


def accuracy_block(b: dict, a: dict, prefix: str = "") -> dict:
    """Greedy accuracy of one row set before (`b`) and after (`a`): overall and per level, the gain, its paired
    standard error, 95% interval and rows gained / lost; every key behind `prefix`."""
    block = {"start_accuracy": b["pass@1"], "accuracy": a["pass@1"], "accuracy_gain": a["pass@1"] - b["pass@1"],
             "start_accuracy_by_level": b["pass@1_by_group"], "accuracy_by_level": a["pass@1_by_group"],
             **paired_gain(b, a)}
    return {prefix + k: v for k, v in block.items()}


def fit_with_receipt(trainer, evals: ReceiptEvaluator, before: dict[str, dict], start_checkpoint: str, run_dir,
                     label: str) -> int:
    """Train, evaluate again, and on rank 0 write `<run_dir>/metrics.json` once (heldout_receipt and the evaluations'
    `receipt_extras`) and their summary lines: the RL stages' shared tail before they publish. Returns the Trainer's
    exit code (0: finished)."""
    code = trainer.fit()
    if code != 0:
        return code
    after = evals()  # collective
    if is_rank0():
        metrics = heldout_receipt(before, after, start_checkpoint, run_dir / "history.jsonl")
        print(f"{label}: held-out greedy accuracy {metrics['start_accuracy']:.3f} -> {metrics['accuracy']:.3f}; "
              f"reward {metrics['reward_first']:.3f} -> {metrics['reward_last']:.3f}")
        atomic_write_json(run_dir / "metrics.json", {**metrics, **evals.receipt_extras(run_dir, label)})
    return 0
