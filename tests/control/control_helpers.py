"""Launch the real SFT stage worker (tests/control/stage_worker.py) with faults armed, directly or under the
supervisor's CLI, and read back what happened: each rank's exit record, the history, the checkpoints, the final
weights, the supervisor's log."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file

from align.train import checkpoint as ckpt_io
from align.utils.tracking import read_history

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).parent / "stage_worker.py"
CONFIG = ROOT / "configs" / "smoke" / "sft.toml"
MAX_STEPS, EVERY = 8, 2  # checkpoints at steps 2, 4, 6, 8; keep_last large so every one stays for inspection
SMALL = ("model.init.hidden_size=32", "model.init.intermediate_size=64", "model.init.num_hidden_layers=1",
         "loader.micro_batch_size=4", "loader.grad_accum=2", "data.threads=1", f"train.max_steps={MAX_STEPS}",
         f"train.checkpoint_every={EVERY}", "train.keep_last=10",
         "inloop_eval.every=0")  # the run directory has no held-out shards (and FSDP2 shards refuse an in-loop Engine)
TIMEOUT_S = 300  # far below the 1800 s ALIGN_PG_TIMEOUT_S default: a hang fails its test instead of stalling CI
FAULT_LINE = re.compile(r"align\.faults: rank (\d+) pid (\d+): (\S+) at (\S+) step=(\d+)")


@dataclass
class Job:
    """One run directory of the SFT stage and its launches. `dir` holds pids, exits.jsonl, once-markers, the log."""

    dir: Path
    runs: Path  # ALIGN_RUNS_DIR: where shards/sft/out lives
    world: int = 1
    faults: str = ""
    overrides: tuple[str, ...] = ()
    env_extra: dict = field(default_factory=dict)

    def __post_init__(self):
        self.dir.mkdir(parents=True, exist_ok=True)

    @property
    def run_dir(self) -> Path:
        return self.dir / "run"

    @property
    def log(self) -> Path:
        return self.dir / "worker.log"

    def argv(self) -> list[str]:
        launcher = [sys.executable] if self.world == 1 else [
            sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={self.world}"]
        return [*launcher, str(WORKER), "--config", str(CONFIG), *SMALL, *self.overrides]

    def env(self) -> dict:
        return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1",
                    ALIGN_RUNS_DIR=str(self.runs), ALIGN_RUN_DIR=str(self.run_dir), CONTROL_DIR=str(self.dir),
                    ALIGN_FAULTS=self.faults, ALIGN_FAULTS_STATE=str(self.dir), **self.env_extra)

    def run(self) -> subprocess.CompletedProcess:
        """One launch, no supervisor."""
        return subprocess.run(self.argv(), env=self.env(), cwd=ROOT, capture_output=True, text=True,
                              timeout=TIMEOUT_S)

    def supervise(self, retries: int = 2) -> subprocess.Popen:
        """`python -m align.utils.supervisor` around the launch, as the pipeline runs it; output in `self.log`."""
        cmd = [sys.executable, "-m", "align.utils.supervisor", "--run-dir", str(self.run_dir), "--retries",
               str(retries), "--backoff", "0", "--log", str(self.log), "--", *self.argv()]
        return subprocess.Popen(cmd, env=self.env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def supervised(self, retries: int = 2) -> int:
        proc = self.supervise(retries)
        return proc.wait(timeout=TIMEOUT_S)

    # -------------------------------------------------------------------------------------------- what happened
    def exits(self) -> list[dict]:
        path = self.dir / "exits.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []

    def last_exits(self) -> list[dict]:
        """The latest launch's record per rank, in rank order."""
        rows = self.exits()[-self.world:]
        return sorted(rows, key=lambda r: r["rank"])

    def attempts(self) -> int:
        return len(re.findall(r"^supervisor: attempt \d+: ", self.log.read_text(), re.M))

    def history(self) -> list[dict]:
        return read_history(self.run_dir / "history.jsonl")

    def complete_checkpoints(self) -> list[int]:
        root = self.run_dir / "checkpoints"
        return sorted(s for s, p in ckpt_io.list_checkpoints(root) if ckpt_io.checkpoint_problem(p) is None)

    def partial_dirs(self) -> list[str]:
        root = self.run_dir / "checkpoints"
        return sorted(p.name for p in root.glob("step_*.partial-*")) if root.is_dir() else []

    def final_weights(self) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for path in sorted((self.run_dir / "final").glob("*.safetensors")):
            out.update(load_file(str(path)))
        assert out, f"no published weights under {self.run_dir / 'final'}"
        return out

    def wait_for(self, predicate, what: str, timeout: float = TIMEOUT_S, poll: float = 0.02):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = predicate()
            if found:
                return found
            time.sleep(poll)
        raise AssertionError(f"timed out waiting for {what}; log tail:\n{self.log_tail()}")

    def log_tail(self, n: int = 4000) -> str:
        return self.log.read_text()[-n:] if self.log.is_file() else "(no log)"

    def pid(self, rank: int) -> int:
        return int((self.dir / f"pid_rank{rank}").read_text())


def assert_bitwise_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"


def fault_lines(text: str) -> list[tuple[int, int, str, str, int]]:
    """(rank, pid, action, point, step) of every fault that fired, from a log."""
    return [(int(r), int(p), a, pt, int(s)) for r, p, a, pt, s in FAULT_LINE.findall(text)]
