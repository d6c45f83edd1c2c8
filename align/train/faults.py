"""Fault injection: deterministic faults at named points of the training loop, armed only by the environment.

The control plane's claims (a stop lands on a step boundary, a killed save is never resumed, a NaN on one rank halts
every rank, a hang ends at the collective timeout) are proven by making the REAL stage worker, launched the real way
(torchrun, the supervisor), fail exactly where a test says (tests/control). Unarmed, every hook is one call that tests
a module global and returns: the loop pays nothing measurable.

    ALIGN_FAULTS="ACTION@POINT[,key=value|flag]...[;...]"   unset or empty: nothing is armed
    ALIGN_FAULTS_STATE=DIR                                   where `once` faults record that they fired

ACTION  kill          SIGKILL this process: no handler, no cleanup (the OOM killer, a lost host)
        signal:NAME   send signal NAME (TERM, INT, ...) to this process: align.train.control's handlers see it
        crash         raise FaultInjected (an unexpected error: a traceback and exit 1)
        delay:S       sleep S seconds (a slow save, a straggler rank, a hang that ends)
        nan           this micro-batch's forward ends in NaN: a real non-finite loss and gradient (point micro only)
POINT   micro         before micro-batch `micro` (default 0) of optimizer step `step` (1-based: the step computed)
        save:begin    the checkpoint save of step `step`: its staging directory exists, nothing is written yet
        save:staged   this rank's files are in staging (before the barrier that precedes the manifest)
        save:manifest rank 0: the manifest is written, the staging directory is not yet renamed into place
        save:published rank 0: `step_<N>` is renamed into place (before the barrier that ends the save)
keys    step=N (N+ : N and every later step; default every step), micro=I, rank=R (default every rank),
        once (fires at most once over all ranks and relaunches: needs ALIGN_FAULTS_STATE)

Example: `signal:TERM@micro,step=3,micro=1,rank=1` is SIGTERM to rank 1 inside step 3's second micro-batch.
Every firing prints one line on stderr (`align.faults: rank R pid P: ...`) before it acts, so a log shows where the
fault landed."""

from __future__ import annotations

import os
import signal
import sys
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from align.exceptions import ConfigError
from align.utils.dist import rank

FAULTS_ENV = "ALIGN_FAULTS"
STATE_ENV = "ALIGN_FAULTS_STATE"
ACTIONS = ("kill", "signal", "crash", "delay", "nan")
SAVE_POINTS = ("save:begin", "save:staged", "save:manifest", "save:published")
POINTS = ("micro",) + SAVE_POINTS


class FaultInjected(RuntimeError):
    """The `crash` action: deliberately not an align error, so it takes the path of an unexpected bug."""


@dataclass(frozen=True)
class Fault:
    action: str
    arg: str  # signal name or delay seconds, as written
    point: str
    step: int | None = None  # None: every step
    and_later: bool = False  # step=N+
    micro: int = 0
    rank: int | None = None  # None: every rank
    once: bool = False
    text: str = ""  # the spec as written: messages and the once-marker's name

    def matches(self, point: str, step: int, micro: int, rank: int) -> bool:
        if point != self.point or (self.rank is not None and rank != self.rank):
            return False
        if point == "micro" and micro != self.micro:
            return False
        if self.step is None:
            return True
        return step >= self.step if self.and_later else step == self.step


def parse_faults(spec: str, source: str = FAULTS_ENV) -> tuple[Fault, ...]:
    """`ALIGN_FAULTS` text -> faults; a malformed token is a ConfigError naming it and what was expected."""
    return tuple(_parse_one(token.strip(), source) for token in spec.split(";") if token.strip())


def _parse_one(token: str, source: str) -> Fault:
    def bad(why: str) -> ConfigError:
        return ConfigError(f"{source}: {token!r}: {why}")

    head, _, rest = token.partition(",")
    action, at, point = head.partition("@")
    action, _, arg = action.partition(":")
    if not at or point not in POINTS:
        raise bad(f"expected ACTION@POINT with POINT one of {', '.join(POINTS)}")
    if action not in ACTIONS:
        raise bad(f"unknown action {action!r}; known: {', '.join(ACTIONS)}")
    if action == "signal" and not hasattr(signal, f"SIG{arg}"):
        raise bad(f"signal:{arg}: expected a signal name such as TERM or INT")
    if action == "delay" and not _is_seconds(arg):
        raise bad(f"delay:{arg}: expected a number of seconds")
    if action == "nan" and point != "micro":
        raise bad("nan poisons a forward: its point must be micro")
    fields: dict = {"action": action, "arg": arg, "point": point, "text": token}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        try:
            if key == "once" and not eq:
                fields["once"] = True
            elif key == "step" and eq:
                fields["and_later"] = value.endswith("+")
                fields["step"] = int(value.removesuffix("+"))
            elif key in ("micro", "rank") and eq:
                fields[key] = int(value)
            else:
                raise ValueError
        except ValueError:
            raise bad(f"bad key {item!r}; expected step=N, step=N+, micro=I, rank=R or once") from None
    if fields.get("once") and not os.environ.get(STATE_ENV):
        raise bad(f"once needs {STATE_ENV} (a directory where firings are recorded)")
    return Fault(**fields)


def _is_seconds(text: str) -> bool:
    try:
        return float(text) >= 0
    except ValueError:
        return False


_plan: tuple[Fault, ...] | None = None  # parsed on the first hook call; () when unarmed
_nan_now = False  # the nan hook's switch, set per micro-batch by at_micro
_hooked: weakref.WeakSet = weakref.WeakSet()  # models carrying the nan hook (an id could be reused)


def armed() -> tuple[Fault, ...]:
    global _plan
    if _plan is None:
        _plan = parse_faults(os.environ.get(FAULTS_ENV, ""))
    return _plan


def reset() -> None:
    """Forget the parsed plan (tests that change ALIGN_FAULTS within one process)."""
    global _plan, _nan_now
    _plan, _nan_now = None, False


def at_micro(step: int, micro: int, model: nn.Module) -> None:
    """Trainer hook, every rank, before each micro-batch of optimizer step `step` (1-based)."""
    global _nan_now
    if not armed():
        return
    _nan_now = False
    for fault in _matching("micro", step, micro):
        if fault.action == "nan":
            _hook_nan(model)
            _nan_now = True
        else:
            _act(fault)


def at_save(point: str, step: int) -> None:
    """Checkpoint-save hook (align.train.checkpoint.save_checkpoint); `point` is one of SAVE_POINTS."""
    if not armed():
        return
    for fault in _matching(point, step, 0):
        _act(fault)


def _matching(point: str, step: int, micro: int):
    r = rank()
    for fault in armed():
        if fault.matches(point, step, micro, r) and _claim(fault):
            print(f"align.faults: rank {r} pid {os.getpid()}: {fault.action}{':' + fault.arg if fault.arg else ''} "
                  f"at {point} step={step}" + (f" micro={micro}" if point == "micro" else "") + f" [{fault.text}]",
                  file=sys.stderr, flush=True)
            yield fault


def _claim(fault: Fault) -> bool:
    """True if `fault` may fire now; a `once` fault claims its marker file first (O_EXCL: one winner ever)."""
    if not fault.once:
        return True
    name = "".join(c if c.isalnum() else "_" for c in fault.text)
    try:
        os.close(os.open(Path(os.environ[STATE_ENV]) / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def _act(fault: Fault) -> None:
    if fault.action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif fault.action == "signal":
        os.kill(os.getpid(), getattr(signal, f"SIG{fault.arg}"))
    elif fault.action == "crash":
        raise FaultInjected(f"injected crash: {fault.text}")
    elif fault.action == "delay":
        time.sleep(float(fault.arg))


def _hook_nan(model: nn.Module) -> None:
    """NaN out the first embedding's output while the switch is on: the loss, the logits and every gradient of
    that micro-batch become non-finite the way an overflow makes them, through the real forward and backward."""
    if model in _hooked:
        return
    embedding = next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)
    if embedding is None:
        raise ConfigError(f"{FAULTS_ENV}: nan needs an nn.Embedding in {type(model).__name__}")
    embedding.register_forward_hook(lambda _mod, _inp, out: out * float("nan") if _nan_now else None)
    _hooked.add(model)
