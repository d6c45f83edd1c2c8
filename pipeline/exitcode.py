"""Make the doit process exit with the failing worker's code (2 bad input, 80-82 halts, 83 refused, 84 disk full)
instead of doit's generic 1, so a script or CI can tell a refusal from a crash. An interrupt (Ctrl-C, SIGTERM) ends
with one line and the worker's exit code (128+N), never a Python traceback (`_excepthook`).

doit returns 1 for any failed task and its console script passes that to `sys.exit`. An `atexit` hook runs after
doit has returned, i.e. after it has saved its dependency database, and replaces the status with the first recorded
worker code. Installed only when the process is the `doit` command itself, never inside a test runner or a caller
that embeds doit."""

from __future__ import annotations

import atexit
import os
import signal
import sys

_codes: list[int] = []
_installed = False
_quiet_interrupt = False
INTERRUPTED = 130  # Ctrl-C outside a worker: the shell's 128 + SIGINT


def record(code: int) -> None:
    _codes.append(int(code))


def recorded() -> list[int]:
    return list(_codes)


def interrupted_quietly() -> None:
    """The launcher has said in one line what an interrupt stopped; the KeyboardInterrupt that then unwinds doit
    prints nothing more."""
    global _quiet_interrupt
    _quiet_interrupt = True


def _stop(signum, _frame) -> None:
    """SIGINT / SIGTERM while no worker runs (the supervisor forwards them while one does): unwind doit as Ctrl-C
    does (it saves its database), exiting 128 + the signal."""
    if not _codes:
        _codes.append(128 + signum)
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _excepthook(kind, value, tb, _previous=sys.excepthook) -> None:
    """Ctrl-C / SIGTERM end doit without a Python traceback: one line (the launcher's, or this one between tasks)."""
    if not issubclass(kind, KeyboardInterrupt):
        _previous(kind, value, tb)
        return
    if not _quiet_interrupt:
        said = f" by {value}" if str(value).startswith("SIG") else ""
        print(f"doit: interrupted{said} while no worker was running; nothing was half-done", file=sys.stderr,
              flush=True)
    if not _codes:
        _codes.append(INTERRUPTED)


def _is_doit_cli() -> bool:
    name = os.path.basename(sys.argv[0]) if sys.argv else ""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return name == "doit" or (spec is not None and spec.name in ("doit", "doit.__main__"))


def _exit_with_recorded() -> None:
    if _codes:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_codes[0])


def install() -> None:
    global _installed
    if not _installed and _is_doit_cli():
        atexit.register(_exit_with_recorded)
        sys.excepthook = _excepthook
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, _stop)
        _installed = True
