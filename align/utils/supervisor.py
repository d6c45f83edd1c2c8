"""Launch supervisor: run a worker in its own process group, tee its output, relaunch it only when that can help.

Stdlib only (the pipeline's launcher runs it in doit's process, which never imports torch).

Relaunch iff all hold (seed 000, "Control plane"):
  - the attempt exited non-zero and not with a HALT code (80/81/82: verdicts about the run, not the host), nor 83
    (refused) nor 2 (bad input: a relaunch reads the same input) nor 84 (disk full: a relaunch writes as much);
  - no HALT.json was written during the attempt (torchrun collapses every worker failure to exit 1, so the marker
    is the verdict whatever the exit code says);
  - retries are left (default 2);
  - the attempt made progress: `history.jsonl` advanced AND the newest *complete* checkpoint
    (`checkpoints/step_<N>/` with a valid manifest) has a higher step than before the attempt; a worker that crashes
    before its first checkpoint would crash again at the same place;
  - the supervisor itself was not asked to stop (SIGINT/SIGTERM are forwarded to the child's group instead);
  - the host preflight passes after the backoff.
Before any relaunch the child's whole process group is killed and confirmed empty, so two generations of a job never
run at once (two trainers writing one run directory)."""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Callable, Sequence

from align.exceptions import ArtifactError, ExitCodeError
from align.exit_codes import BAD_INPUT, DISK_FULL, HALT_CODES, HALT_MARKER, NAMES, PREFLIGHT_REFUSED, \
    read_halt_marker
from align.utils.manifest import read_manifest

_STEP_DIR = re.compile(r"^step_(\d+)$")
TORCHRUN_GRACE_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"  # torchrun's SIGTERM -> SIGKILL grace for its workers


@dataclass(frozen=True)
class SupervisorConfig:
    max_retries: int = 2  # relaunches after the first attempt
    backoff_s: float = 5.0  # wait before the preflight that gates a relaunch
    kill_grace_s: float = 10.0  # SIGTERM -> SIGKILL grace when tearing down a process group
    empty_timeout_s: float = 30.0  # how long to wait for a killed group to disappear
    stop_grace_s: int = 600  # how long a signalled torchrun lets its workers finish the step and the stop checkpoint


@dataclass(frozen=True)
class ProgressMark:
    history: tuple[int, int] | None  # (size, mtime_ns) of history.jsonl
    checkpoint_step: int | None  # step of the newest complete checkpoint


@dataclass
class Attempt:
    number: int
    exit_code: int
    wall_s: float
    progressed: bool
    halt: dict | None


@dataclass
class SupervisedResult:
    exit_code: int
    reason: str  # why the supervisor stopped launching
    attempts: list[Attempt] = field(default_factory=list)
    last_line: str = ""  # the last line the final attempt printed (a failing worker's one-line reason)
    signalled: bool = False  # the supervisor was sent SIGINT/SIGTERM (forwarded to the worker)


# ---------------------------------------------------------------------------------------------------- progress

def newest_complete_checkpoint(run_dir: str | os.PathLike) -> int | None:
    """Step of the newest `checkpoints/step_<N>/` whose manifest is present and whose files match it in size."""
    ckpts = Path(run_dir) / "checkpoints"
    if not ckpts.is_dir():
        return None
    steps = sorted((int(m.group(1)) for p in ckpts.iterdir() if (m := _STEP_DIR.match(p.name))), reverse=True)
    for step in steps:
        try:
            read_manifest(ckpts / f"step_{step}")
            return step
        except ArtifactError:
            continue  # a save that died half-way is not progress (and is never resumed from)
    return None


def progress_mark(run_dir: str | os.PathLike) -> ProgressMark:
    hist = Path(run_dir) / "history.jsonl"
    stat = hist.stat() if hist.is_file() else None
    return ProgressMark(history=(stat.st_size, stat.st_mtime_ns) if stat else None,
                        checkpoint_step=newest_complete_checkpoint(run_dir))


def made_progress(before: ProgressMark, after: ProgressMark) -> bool:
    history_advanced = after.history is not None and after.history != before.history
    ckpt_advanced = after.checkpoint_step is not None and (before.checkpoint_step is None
                                                           or after.checkpoint_step > before.checkpoint_step)
    return history_advanced and ckpt_advanced


def fresh_halt(run_dir: str | os.PathLike, since: float) -> dict | None:
    """The HALT marker if it was written during the attempt that started at `since` (wall-clock seconds)."""
    path = Path(run_dir) / HALT_MARKER
    try:
        if path.stat().st_mtime < since:
            return None
        return read_halt_marker(run_dir)
    except (OSError, ValueError):
        return None


def stop_reason(code: int, halt: dict | None, retries_left: int, progressed: bool, interrupted: bool) -> str | None:
    """Why not to relaunch after an attempt, or None when a relaunch is allowed (before the preflight)."""
    if code == 0:
        return "finished"
    if interrupted:
        return f"supervisor was signalled; worker exited {code}"
    if code in HALT_CODES or code in (PREFLIGHT_REFUSED, BAD_INPUT, DISK_FULL):
        return f"exit {code} ({NAMES[code]}) is a verdict, not relaunched"
    if halt is not None:
        return f"HALT.json written during the attempt (exit {halt.get('exit_code')}: {halt.get('reason')})"
    if retries_left <= 0:
        return f"exit {code}; retry budget spent"
    if not progressed:
        return f"exit {code} without progress (no new history and no newer complete checkpoint); not relaunched"
    return None


# ---------------------------------------------------------------------------------------------------- process group

def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group. NOTE: a zombie still answers kill(0) and, when PID 1 does not
    reap orphans (containers), stays forever; it holds no resources, so it does not count."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp ...
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def kill_group(pgid: int, grace_s: float, empty_timeout_s: float) -> None:
    """SIGTERM the group, SIGKILL what is left after `grace_s`, and return only once it is empty."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, empty_timeout_s)):
        if not group_members(pgid):
            return
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not group_members(pgid):
                return
            time.sleep(0.05)
    raise RuntimeError(f"process group {pgid} still has live members {group_members(pgid)} after SIGKILL")


class _Tee:
    """Copies the child's output to every sink and keeps its tail, whose last line is the worker's one-line reason
    when it fails (run_with_exit_codes prints it last)."""

    def __init__(self, src: BinaryIO, sinks: Sequence[BinaryIO]):
        self.src, self.sinks, self.tail = src, sinks, b""
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while chunk := os.read(self.src.fileno(), 1 << 16):
            self.tail = (self.tail + chunk)[-4096:]
            for sink in self.sinks:
                sink.write(chunk)
                sink.flush()

    def last_line(self) -> str:
        lines = [ln.strip() for ln in self.tail.decode("utf-8", "replace").splitlines() if ln.strip()]
        return lines[-1] if lines else ""


class _Forwarder:
    """While installed, SIGINT/SIGTERM to the supervisor are passed to the child's group (the worker stops at its
    next step boundary and checkpoints) and no relaunch follows. Only the main thread can install handlers."""

    def __init__(self):
        self.pgid: int | None = None
        self.signalled = False
        self._old: dict[int, object] = {}

    def __enter__(self) -> "_Forwarder":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, _frame) -> None:
        self.signalled = True
        if self.pgid is not None:
            try:
                os.killpg(self.pgid, signum)
            except ProcessLookupError:
                pass

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


# ---------------------------------------------------------------------------------------------------- supervise

def run_attempt(argv: Sequence[str], *, env: dict | None, cwd: str | os.PathLike | None, sinks: Sequence[BinaryIO],
                pass_fds: Sequence[int], forwarder: _Forwarder, config: SupervisorConfig) -> tuple[int, str]:
    """One launch: own process group, output teed to `sinks`, group emptied before returning
    (exit code, last output line)."""
    proc = subprocess.Popen(list(argv), env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True, pass_fds=tuple(pass_fds))
    forwarder.pgid = proc.pid
    tee = _Tee(proc.stdout, sinks)
    try:
        code = proc.wait()
    finally:
        # A crashed launcher (torchrun) can leave workers behind; they would hold the pipe, the lock, the run dir.
        kill_group(proc.pid, config.kill_grace_s, config.empty_timeout_s)
        forwarder.pgid = None
        tee.thread.join(timeout=5)
        proc.stdout.close()
    return (128 - code if code < 0 else code), tee.last_line()  # killed by a signal: the shell's 128+signum


def supervise(argv: Sequence[str], run_dir: str | os.PathLike, *, config: SupervisorConfig = SupervisorConfig(),
              env: dict | None = None, cwd: str | os.PathLike | None = None, log: BinaryIO | None = None,
              echo: BinaryIO | None = None, preflight: Callable[[], object] | None = None,
              pass_fds: Sequence[int] = (), say: Callable[[str], None] | None = None) -> SupervisedResult:
    """Run `argv` until it succeeds or a relaunch cannot help (module docstring). Output goes to `log` and `echo`
    (default: this process's stdout). `preflight` raises `ExitCodeError` to refuse a relaunch."""
    echo = echo if echo is not None else sys.stdout.buffer
    sinks = [s for s in (log, echo) if s is not None]
    # NOTE: a forwarded SIGTERM reaches torchrun too, which SIGKILLs its workers 30 s later by default: a stop whose
    # checkpoint takes longer (any 7B save) would die mid-save and lose it (tests/control/test_supervisor_stops.py).
    env = dict(os.environ if env is None else env)
    env.setdefault(TORCHRUN_GRACE_ENV, str(config.stop_grace_s))
    say = say or (lambda msg: _note(sinks, msg))
    attempts: list[Attempt] = []
    with _Forwarder() as forwarder:
        while True:
            number = len(attempts) + 1
            say(f"supervisor: attempt {number}: {' '.join(argv)}")
            before, t0, wall0 = progress_mark(run_dir), time.monotonic(), time.time()
            code, last_line = run_attempt(argv, env=env, cwd=cwd, sinks=sinks, pass_fds=pass_fds, forwarder=forwarder,
                               config=config)
            halt = fresh_halt(run_dir, wall0)
            attempt = Attempt(number, code, time.monotonic() - t0, made_progress(before, progress_mark(run_dir)),
                              halt)
            attempts.append(attempt)
            reason = stop_reason(code, halt, config.max_retries - (number - 1), attempt.progressed,
                                 forwarder.signalled)
            if reason is None:
                say(f"supervisor: attempt {number} exited {code} after progress; relaunch in {config.backoff_s:g} s")
                time.sleep(config.backoff_s)
                reason = _refused_by_preflight(preflight)
            if reason is not None:
                final = halt["exit_code"] if halt is not None and code not in HALT_CODES and code != 0 else code
                if code != 0:
                    say(f"supervisor: stop: {reason}")
                return SupervisedResult(int(final), reason, attempts, last_line, forwarder.signalled)


def _refused_by_preflight(preflight: Callable[[], object] | None) -> str | None:
    if preflight is None:
        return None
    try:
        preflight()
    except ExitCodeError as exc:
        return f"relaunch refused by preflight: {exc}"
    return None


def _note(sinks: Sequence[BinaryIO], msg: str) -> None:
    for sink in sinks:
        sink.write((msg + "\n").encode())
        sink.flush()


def main(args: Sequence[str] | None = None) -> int:
    """`python -m align.utils.supervisor --run-dir D [--retries N] -- cmd ...`: supervise one command."""
    parser = argparse.ArgumentParser(prog="python -m align.utils.supervisor", description=main.__doc__)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--retries", type=int, default=SupervisorConfig.max_retries)
    parser.add_argument("--backoff", type=float, default=SupervisorConfig.backoff_s)
    parser.add_argument("--log", default=None, help="also append the child's output to this file")
    parser.add_argument("cmd", nargs=argparse.REMAINDER)
    ns = parser.parse_args(args)
    cmd = ns.cmd[1:] if ns.cmd[:1] == ["--"] else ns.cmd
    if not cmd:
        parser.error("no command given after --")
    cfg = SupervisorConfig(max_retries=ns.retries, backoff_s=ns.backoff)
    log = open(ns.log, "ab") if ns.log else None
    try:
        result = supervise(cmd, ns.run_dir, config=cfg, log=log)
    finally:
        if log is not None:
            log.close()
    return result.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
