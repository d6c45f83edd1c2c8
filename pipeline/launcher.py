"""The worker launcher: what a ladder task's action does.

Resolved when doit builds its task list (`plan`), run as the task's action (`execute`):
  1. refuse at once, with one line, what cannot work: a missing or malformed config, a bad common.toml, a missing
     worker module;
  2. heavy stages: take the host's heavy-job lock, then the host preflight (exit 83 on refusal);
  3. run the worker under the supervisor (own process group, output streamed and appended to
     `<run_dir>/worker.log`, bounded relaunch), `torchrun` when the profile asks for more than one rank: one node
     `--standalone`; several nodes ([run] nnodes) torchrun's c10d rendezvous on [run] rdzv_endpoint, this node's
     index from $ALIGN_NODE_RANK (each node runs the same doit; lock and preflight are this node's);
  4. check every target exists, then write the receipt, last (node 0 only: one receipt per task).
A failure returns doit's `TaskFailed` (doit records nothing as done) and records the worker's exit code, which the
doit process then exits with (pipeline.exitcode)."""

from __future__ import annotations

import codecs
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from doit.exceptions import TaskFailed

from align.config import ConfigError
from align.exceptions import ExitCodeError
from align.exit_codes import BAD_INPUT
from align.utils.fsio import sha256_bytes
from align.profile import CommonConfig
from align.utils.guard import HeavyJobLock, preflight, resolve_lock_path
from align.utils.supervisor import SupervisedResult, supervise
from pipeline import exitcode
from pipeline.hashing import config_text, module_file
from pipeline.layout import Project, StageCtx, relative_to_root
from pipeline.receipts import read_metrics, write_receipt
from pipeline.stage import StageSpec

LOG_NAME = "worker.log"


@dataclass(frozen=True)
class Launch:
    """One task's launch, fully resolved; `problem` is set when it cannot run (reported by `execute`)."""

    task: str
    profile: str
    root: Path
    runs: Path
    run_dir: Path
    receipt: Path
    argv: tuple[str, ...]
    file_dep: tuple[Path, ...]
    targets: tuple[Path, ...]
    config: str  # canonical text of the stage config (includes merged, keys sorted)
    code_digest: str
    heavy: bool
    common: CommonConfig | None
    problem: str | None
    node_rank: int = 0  # $ALIGN_NODE_RANK: this machine's index among [run] nnodes

    def identity(self) -> dict:
        """What `config_changed` compares between runs: config values, code, and how the worker is launched."""
        return {"config": self.config, "code": self.code_digest, "argv": list(self.argv[1:]),
                "problem": self.problem}

    @property
    def log(self) -> Path:
        return self.run_dir / LOG_NAME


def plan(spec: StageSpec, ctx: StageCtx, project: Project, code_digest: str, common: CommonConfig | None,
         common_problem: str | None) -> Launch:
    config_path = spec.config_path(ctx)
    problem, text = common_problem, ""
    try:
        text = config_text(config_path)
    except ConfigError as exc:
        problem = problem or str(exc)
    if spec.worker.split(".")[0] in project.packages and module_file(project.root, spec.worker) is None:
        problem = problem or f"stage {ctx.task}: worker module {spec.worker} not found under {project.root}"
    argv = [project.python, "-m", spec.worker, "--config", relative_to_root(config_path, project.root), *spec.args(ctx)]
    node_rank = 0
    if common is not None and spec.distributed and common.run.world_size > 1:
        try:
            node_rank = node_rank_from_env(common.run.nnodes)
        except ValueError as exc:
            problem = problem or str(exc)
        argv = [project.python, "-m", "torch.distributed.run",
                *torchrun_args(common.run, re.sub(r"[^A-Za-z0-9_.-]", "-", f"align-{ctx.profile}-{ctx.task}")),
                *argv[1:]]
    return Launch(
        task=ctx.task, profile=ctx.profile, root=project.root, runs=ctx.runs, run_dir=ctx.run_dir, receipt=ctx.receipt,
        argv=tuple(argv), file_dep=tuple(Path(p) for p in spec.file_dep(ctx)),
        targets=tuple(Path(p) for p in spec.targets(ctx)), config=text,
        code_digest=code_digest,
        heavy=spec.heavy, common=common, problem=problem, node_rank=node_rank)


NODE_RANK_ENV = "ALIGN_NODE_RANK"


def node_rank_from_env(nnodes: int) -> int:
    raw = os.environ.get(NODE_RANK_ENV, "0")
    if not raw.isdigit() or int(raw) >= nnodes:
        raise ValueError(f"{NODE_RANK_ENV}={raw!r}: expected an integer in [0, {nnodes}) ([run] nnodes = {nnodes})")
    return int(raw)


def torchrun_args(run, rdzv_id: str) -> list[str]:
    """torchrun's launch flags for [run]: one node standalone, else c10d rendezvous (the id names the task, so the
    nodes of one task meet and two tasks never do). NOTE: c10d numbers the ranks by its own order of the nodes, not
    by ALIGN_NODE_RANK; nothing in align depends on which node holds global rank 0 (runs/ is shared)."""
    if run.nnodes == 1:
        return ["--standalone", f"--nproc-per-node={run.world_size}"]
    return [f"--nnodes={run.nnodes}", f"--nproc-per-node={run.world_size // run.nnodes}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={run.rdzv_endpoint}", f"--rdzv-id={rdzv_id}", "--max-restarts=0"]


def _fail(code: int, message: str) -> TaskFailed:
    exitcode.record(code)
    print(f"align: {message}", file=sys.stderr, flush=True)
    return TaskFailed(message)


def execute(launch: Launch) -> TaskFailed | None:
    """The doit action of a ladder task."""
    if launch.problem is not None:
        return _fail(BAD_INPUT, launch.problem)
    absent = [relative_to_root(p, launch.root) for p in launch.file_dep if not p.exists()]
    if absent:  # doit runs a task whose input no task produces; say so instead of letting the worker find out
        return _fail(BAD_INPUT, f"{launch.task}: input {absent[0]} does not exist and no declared stage produces it")
    launch.run_dir.mkdir(parents=True, exist_ok=True)
    launch.receipt.unlink(missing_ok=True)  # a receipt must never describe outputs being replaced
    lock = None
    try:
        if launch.heavy:
            lock = HeavyJobLock(launch.root / resolve_lock_path(launch.common.lock),
                                command=f"align {launch.task} (profile {launch.profile}) pid {os.getpid()}")
            lock.acquire()
            preflight(launch.common.preflight, launch.run_dir)
        t0 = time.monotonic()
        result = _run_worker(launch, lock)
    except ExitCodeError as exc:
        return _fail(exc.exit_code, f"{launch.task}: {exc}")
    finally:
        if lock is not None:
            lock.release()
    if result.signalled:
        # Ctrl-C / SIGTERM reached doit (and, forwarded, the worker, which stopped cleanly): stop the whole run the
        # way doit stops on Ctrl-C (it saves its database and runs nothing else), exiting with the worker's code.
        exitcode.record(result.exit_code)
        raise KeyboardInterrupt(f"{launch.task}: interrupted; worker exited {result.exit_code}")
    if result.exit_code != 0:
        said = result.last_line.removeprefix("align: ")
        return _fail(result.exit_code, f"{launch.task}: worker exited {result.exit_code}: {said} "
                                       f"[{result.reason}; log {relative_to_root(launch.log, launch.root)}]")
    missing = [str(p) for p in launch.targets if not p.is_file()]
    if missing:
        return _fail(1, f"{launch.task}: worker exited 0 but did not publish {', '.join(missing)}")
    if launch.node_rank != 0:  # one receipt per task: node 0's launcher writes it
        return None
    write_receipt(launch.receipt, task=launch.task, profile=launch.profile, root=launch.root,
                  inputs=launch.file_dep, outputs=launch.targets, code_digest=launch.code_digest,
                  config_digest=sha256_bytes(launch.config.encode()), config=_resolved_config(launch),
                  metrics=read_metrics(launch.run_dir), wall_s=time.monotonic() - t0,
                  extra={"argv": list(launch.argv[1:])})
    return None


def _resolved_config(launch: Launch) -> str:
    # The worker's own resolved config (defaults filled in) when it wrote one; else the file as the launcher read it.
    resolved = launch.run_dir / "resolved_config.toml"
    return resolved.read_text() if resolved.is_file() else launch.config


# NOTE: glibc serves blocks over its mmap threshold with fresh mmaps and trims freed heap tops, so every step's
# 16 MB temporaries (the tiny model's 32768 x 128 head gradient, AdamW's moments) fault their pages in again: 470k
# minor faults in 13 tiny SFT steps, 10% of the step (docs/MEASUREMENTS.md, train). Keeping them in the heap costs
# RSS only up to the peak a step reaches anyway. Exported values win.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30),
              "MALLOC_TOP_PAD_": str(64 << 20)}


def _malloc_env() -> dict[str, str]:
    return {key: os.environ.get(key, value) for key, value in MALLOC_ENV.items()}


def _run_worker(launch: Launch, lock: HeavyJobLock | None) -> SupervisedResult:
    env = dict(os.environ, ALIGN_PROFILE=launch.profile, ALIGN_RUN_DIR=str(launch.run_dir),
               ALIGN_RUNS_DIR=str(launch.runs), ALIGN_ROOT=str(launch.root),
               ALIGN_CODE_DIGEST=launch.code_digest,  # part of a training run's identity (align.train.identity)
               PYTHONUNBUFFERED="1",
               # NOTE: a spinning OpenMP pool (the default ACTIVE wait) on a host shared with other jobs waits on a
               # descheduled peer: the tiny SFT ran 6x slower under load. An exported OMP_WAIT_POLICY wins.
               OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),
               **_malloc_env(),
               PYTHONPATH=os.pathsep.join(p for p in (str(launch.root), os.environ.get("PYTHONPATH")) if p))
    common = launch.common
    check = (lambda: preflight(common.preflight, launch.run_dir)) if launch.heavy else None
    with open(launch.log, "ab") as log:
        result = supervise(launch.argv, launch.run_dir, config=common.supervisor, env=env, cwd=launch.root,
                           log=log, echo=_stdout_sink(), preflight=check,
                           pass_fds=(lock.fileno(),) if lock is not None else ())
    return result


class _TextSink:
    """Bytes in, text out, for a stdout that has no binary buffer (doit or pytest capturing it)."""

    def __init__(self, stream):
        self.stream = stream
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def write(self, data: bytes) -> None:
        self.stream.write(self.decoder.decode(data))

    def flush(self) -> None:
        self.stream.flush()


def _stdout_sink():
    buffer = getattr(sys.stdout, "buffer", None)
    return buffer if buffer is not None else _TextSink(sys.stdout)
