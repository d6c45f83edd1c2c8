"""The golden_eval worker's real small project, shared by test_golden_eval_stage.py and test_outcome.py (the
`eval_project` fixture of conftest.py builds it): an eval shard set, a model that answers `\\boxed{7}` to every
prompt, and the worker run in this process as the launcher runs it."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch

from align.exit_codes import run_with_exit_codes
from align.stages import golden_eval
from eval_fixtures import answer_model, build_eval_shards, save

# answers "7" to everything: accuracy 3/6 = 0.5, and 0.5 on each level (levels 1, 2, 3 cycle over the rows)
GOLDS = ["7", "3", "7", "12", "7", "4"]


def build_eval_project(root: Path, golds: list[str] = GOLDS, answer: str = r"The answer is \boxed{7}.") -> Path:
    """`root` as a project of profile smoke: the eval shard set of `golds` under runs/smoke/shards/eval/out, a model
    answering `answer` to every prompt as runs/smoke/sft_checkpoint/final, and an empty configs/smoke/."""
    runs = root / "runs" / "smoke"
    build_eval_shards(root, runs / "shards" / "eval" / "out", golds)
    save(answer_model(answer), runs / "sft_checkpoint" / "final")
    (root / "configs" / "smoke").mkdir(parents=True)
    return root


def run_golden_eval(root: Path, config: Path, stage: str) -> tuple[int, dict, str]:
    """(exit code, metrics.json, what the worker printed): the worker's main() in this process, with the launcher's
    environment and command line (the doit path is tests/integration's); a metrics.json of an earlier run is never
    read back."""
    runs = root / "runs" / "smoke"
    run_dir = runs / "golden_eval" / stage
    (run_dir / "metrics.json").unlink(missing_ok=True)
    argv = ["align.stages.golden_eval", "--config", str(config), f"stage={stage}"]
    env = {"ALIGN_RUNS_DIR": str(runs), "ALIGN_RUN_DIR": str(run_dir), "ALIGN_ROOT": str(root)}
    out, threads = io.StringIO(), torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sys.argv", argv)
        for k, v in env.items():
            mp.setenv(k, v)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            code = run_with_exit_codes(golden_eval.main)
    torch.set_num_threads(threads)
    metrics = json.loads((run_dir / "metrics.json").read_text()) if code == 0 else {}
    return code, metrics, out.getvalue()
