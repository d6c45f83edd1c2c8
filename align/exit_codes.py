"""The trainer <-> supervisor contract: the HALT marker, and the wrapper every stage entry point uses (the exit codes
themselves are defined beside the errors in align.exceptions and re-exported here).

HALT codes are verdicts about the run, not the host: a supervisor must not relaunch them. Because torchrun reports
1 for any worker failure, the verdict is also written to `<run_dir>/HALT.json` before the process exits."""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, NoReturn

from align.exceptions import (BAD_INPUT, DISK_FULL, HALT_CODES, NAMES, NONFINITE_HALT, OK, PREFLIGHT_REFUSED,
                               TRIPWIRE_HALT, WALL_BUDGET, AlignInputError, ExitCodeError)
from align.utils.fsio import atomic_write_json, disk_full_error

# OK .. NAMES above are re-exported: callers of the supervisor contract read the codes from here.

HALT_MARKER = "HALT.json"


def write_halt_marker(run_dir: str | os.PathLike, code: int, reason: str) -> Path:
    """Atomically write `<run_dir>/HALT.json` (tmp + fsync + rename): a crash leaves the old marker or the new one."""
    path = Path(run_dir) / HALT_MARKER
    atomic_write_json(path, {"exit_code": int(code), "name": NAMES.get(code, "halt"), "reason": reason,
                             "pid": os.getpid(), "time": time.time()})
    return path


def read_halt_marker(run_dir: str | os.PathLike) -> dict | None:
    path = Path(run_dir) / HALT_MARKER
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def run_with_exit_codes(main: Callable[[], int | None]) -> int:
    """Run `main` and turn align's expected failures into an exit code and one line on stderr (no traceback).

    Unexpected exceptions propagate with their traceback: they are bugs, not verdicts."""
    try:
        code = main()
    except ExitCodeError as exc:
        print(f"align: {NAMES.get(exc.exit_code, 'exit')} ({exc.exit_code}): {exc}", file=sys.stderr)
        return exc.exit_code
    except AlignInputError as exc:
        print(f"align: {type(exc).__name__}: {exc}", file=sys.stderr)
        return BAD_INPUT
    except OSError as exc:  # a write outside align.utils.fsio (history, logs) that found the disk full
        err = disk_full_error(exc.filename, None, exc)
        if err is None:
            raise
        print(f"align: {NAMES[DISK_FULL]} ({DISK_FULL}): {err}", file=sys.stderr)
        return DISK_FULL
    return int(code or 0)


def exit_stage(main: Callable[[], int | None]) -> NoReturn:
    """A stage worker's `__main__`: run `main` through `run_with_exit_codes` and leave the process with its code.

    In a process group (torchrun) an unexpected exception prints its traceback and exits 1 the same way."""
    try:
        code = run_with_exit_codes(main)
    except Exception:
        if not in_process_group():
            raise
        traceback.print_exc()
        code = 1
    leave(code)


def leave(code: int) -> NoReturn:
    """Exit with `code`; a process in a process group leaves through `align.utils.dist.exit_process` (see its note:
    gloo state torn down at interpreter exit aborts a finished rank now and then)."""
    if in_process_group():
        from align.utils.dist import exit_process

        exit_process(code)
    raise SystemExit(code)


def in_process_group() -> bool:
    dist = sys.modules.get("torch.distributed")  # never import torch here: the launcher side stays light
    return dist is not None and dist.is_available() and dist.is_initialized()
