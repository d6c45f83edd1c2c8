"""`[inloop_eval]`: the in-loop held-out evaluation of a training stage (align.eval.inloop runs it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class InLoopEvalConfig:
    """[inloop_eval] table (paths relative to the profile's runs directory)."""

    every: int = 0  # optimizer steps between evaluations (0: off); the last step is always evaluated when on
    rows: int = 64  # the first N held-out problems (the bundled eval split interleaves levels)
    max_new_tokens: int = 64
    prompts: str = "shards/eval/out"  # kind "prompts": prompt ids + gold answers (greedy accuracy)
    solutions: str = "shards/eval_sft/out"  # kind "sft": the same problems with worked solutions (NLL); "": no NLL
    nll_batch_rows: int = 32

    def __post_init__(self):
        if self.every < 0 or self.rows < 1 or self.max_new_tokens < 1 or self.nll_batch_rows < 1:
            raise ValueError("inloop_eval: every >= 0, rows >= 1, max_new_tokens >= 1 and nll_batch_rows >= 1")
