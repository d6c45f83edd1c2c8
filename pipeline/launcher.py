"""The worker launcher: what a ladder task's action does.

Resolved when doit builds its task list (`plan`), run as the task's action (`execute`):
  1. refuse at once, with one line, what cannot work: a missing or malformed config, a bad common.toml, a missing
     worker module, an input artifact whose files no longer match its manifest (exit 2: nothing is built on it);
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
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from doit.exceptions import TaskFailed

from align.config import ConfigError
from align.exceptions import ArtifactError, DiskFullError, ExitCodeError
from align.exit_codes import BAD_INPUT
from align.utils.fsio import disk_full_error, sha256_bytes
from align.utils.manifest import MANIFEST, verify_artifact
from align.utils.numerics import PINNED_ENV, host_fingerprint
from align.utils.stat_cache import CACHE_ENV
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
    modified = verify_inputs(launch)
    if modified is not None:
        return _fail(BAD_INPUT, modified)
    try:
        launch.run_dir.mkdir(parents=True, exist_ok=True)
        launch.receipt.unlink(missing_ok=True)  # a receipt must never describe outputs being replaced
    except OSError as exc:
        return _disk_or_raise(launch, launch.run_dir, exc)
    lock = None
    try:
        if launch.heavy:
            lock = HeavyJobLock(launch.root / resolve_lock_path(launch.common.lock),
                                command=f"align {launch.task} (profile {launch.profile}) pid {os.getpid()}")
            lock.acquire()
            preflight(launch.common.preflight, launch.run_dir)
        t0, cpu0 = time.monotonic(), children_cpu_s()
        result = _run_worker(launch, lock)
    except ExitCodeError as exc:
        return _fail(exc.exit_code, f"{launch.task}: {exc}")
    except OSError as exc:  # worker.log on a full disk
        return _disk_or_raise(launch, launch.log, exc)
    finally:
        if lock is not None:
            lock.release()
    if result.signalled and result.exit_code == 0:
        return _finished_then_interrupted(launch, t0, cpu0)
    if result.signalled:
        # Ctrl-C / SIGTERM reached doit (and, forwarded, the worker, which stopped cleanly): stop the whole run the
        # way doit stops on Ctrl-C (it saves its database and runs nothing else), exiting with the worker's code.
        # One line says what stopped and what it left; pipeline.exitcode keeps Python's traceback off the terminal.
        exitcode.record(result.exit_code)
        print(f"align: {interrupted_line(launch, result.exit_code)}", file=sys.stderr, flush=True)
        exitcode.interrupted_quietly()
        raise KeyboardInterrupt(f"{launch.task}: interrupted; worker exited {result.exit_code}")
    if result.exit_code != 0:
        said = result.last_line.removeprefix("align: ")
        return _fail(result.exit_code, f"{launch.task}: worker exited {result.exit_code}: {said} "
                                       f"[{result.reason}; log {relative_to_root(launch.log, launch.root)}]")
    return _receipt(launch, t0, cpu0)


def children_cpu_s() -> float:
    """User + system CPU seconds of every reaped descendant of this process (the supervisor waits for the worker,
    torchrun for its ranks): the difference across one task is what its worker spent, on every core."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _finished_then_interrupted(launch: Launch, t0: float, cpu0: float) -> TaskFailed | None:
    """The interrupt came as the worker was publishing: its outputs are complete, so the task gets its receipt;
    then doit stops as for any interrupt (exit 130), running nothing else."""
    failed = _receipt(launch, t0, cpu0)
    if failed is not None:
        return failed
    exitcode.record(exitcode.INTERRUPTED)
    print(f"align: {launch.task}: interrupted as its worker finished (exit 0); the task is complete; nothing else "
          "runs", file=sys.stderr, flush=True)
    exitcode.interrupted_quietly()
    raise KeyboardInterrupt(f"{launch.task}: interrupted after it finished")


def _receipt(launch: Launch, t0: float, cpu0: float) -> TaskFailed | None:
    missing = [str(p) for p in launch.targets if not p.is_file()]
    if missing:
        return _fail(1, f"{launch.task}: worker exited 0 but did not publish {', '.join(missing)}")
    if launch.node_rank != 0:  # one receipt per task: node 0's launcher writes it
        return None
    try:
        write_receipt(launch.receipt, task=launch.task, profile=launch.profile, root=launch.root,
                      inputs=launch.file_dep, outputs=launch.targets, code_digest=launch.code_digest,
                      config_digest=sha256_bytes(launch.config.encode()), config=_resolved_config(launch),
                      metrics=read_metrics(launch.run_dir), wall_s=time.monotonic() - t0,
                      extra={"argv": list(launch.argv[1:]), "numerics": numerics_env(),
                             # the worker's CPU seconds (every attempt, every rank on this node): compute spent,
                             # which a no-RL control matches against the RL rung (bench/norl_control.py)
                             "cpu_s": round(children_cpu_s() - cpu0, 2)})
    except DiskFullError as exc:  # no receipt: doit records nothing as done and reruns the task next time
        return _fail(exc.exit_code, f"{launch.task}: receipt not written: {exc}")
    return None


def stat_cache_dir(runs: Path) -> Path | None:
    """The stat cache the workers of a profile share (align.utils.stat_cache): runs/<profile>/.stat_cache."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return None if explicit == "off" else Path(explicit)
    return runs / ".stat_cache"


def verify_inputs(launch: Launch) -> str | None:
    """Check every input artifact (a `file_dep` that is a manifest) against its manifest's sha256s before the
    worker runs; the stat cache makes an unchanged artifact cost one stat per file. Returns the refusal line."""
    cache = stat_cache_dir(launch.runs)
    for dep in launch.file_dep:
        if dep.name != MANIFEST:
            continue  # a plain file input: doit's md5 of it already notices any change
        try:
            verify_artifact(dep.parent, cache_dir=cache, profile=launch.profile)
        except ArtifactError as exc:
            return f"{launch.task}: input {relative_to_root(dep.parent, launch.root)} was modified: {exc}"
    return None


def _disk_or_raise(launch: Launch, path: Path, exc: OSError) -> TaskFailed:
    err = disk_full_error(path, None, exc)
    if err is None:
        raise exc
    return _fail(err.exit_code, f"{launch.task}: {err}")


def interrupted_line(launch: Launch, code: int) -> str:
    """`<task>: interrupted; worker exited N; it left checkpoint <path>` (the newest complete one, if any)."""
    left = newest_checkpoint(launch.run_dir)
    where = (f"it left checkpoint {relative_to_root(left, launch.root)} (the next run resumes from it)"
             if left is not None else "no checkpoint was left (the next run starts the stage afresh)")
    return f"{launch.task}: interrupted; worker exited {code}; {where}"


def newest_checkpoint(run_dir: Path) -> Path | None:
    """The complete `checkpoints/step_<N>` (its manifest present) with the highest N, by path alone (no torch)."""
    found = []
    for path in (run_dir / "checkpoints").glob("step_*"):
        step = path.name.removeprefix("step_")
        if step.isdigit() and (path / MANIFEST).is_file():
            found.append((int(step), path))
    return max(found)[1] if found else None


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


def pinned_numerics_env() -> dict[str, str]:
    """Thread counts that must not follow the host's load (align.utils.numerics): exported values win."""
    return {key: os.environ.get(key, value) for key, value in PINNED_ENV.items()}


def numerics_env() -> dict:
    """What the receipt records of the worker's numerics: the host and the pinned variables the worker got."""
    found = host_fingerprint()
    found["env"] = {**found["env"], **pinned_numerics_env()}
    return found


def _run_worker(launch: Launch, lock: HeavyJobLock | None) -> SupervisedResult:
    env = dict(os.environ, ALIGN_PROFILE=launch.profile, ALIGN_RUN_DIR=str(launch.run_dir),
               ALIGN_RUNS_DIR=str(launch.runs), ALIGN_ROOT=str(launch.root),
               ALIGN_CODE_DIGEST=launch.code_digest,  # part of a training run's identity (align.train.identity)
               PYTHONUNBUFFERED="1",
               # NOTE: a spinning OpenMP pool (the default ACTIVE wait) on a host shared with other jobs waits on a
               # descheduled peer: the tiny SFT ran 6x slower under load. An exported OMP_WAIT_POLICY wins.
               OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),
               **_malloc_env(), **pinned_numerics_env(),
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
