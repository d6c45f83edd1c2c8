"""Make the doit process exit with the failing worker's code (2 bad input, 80-82 halts, 83 refused) instead of
doit's generic 1, so a script or CI can tell a refusal from a crash.

doit returns 1 for any failed task and its console script passes that to `sys.exit`. An `atexit` hook runs after
doit has returned, i.e. after it has saved its dependency database, and replaces the status with the first recorded
worker code. Installed only when the process is the `doit` command itself, never inside a test runner or a caller
that embeds doit."""

from __future__ import annotations

import atexit
import os
import sys

_codes: list[int] = []
_installed = False


def record(code: int) -> None:
    _codes.append(int(code))


def recorded() -> list[int]:
    return list(_codes)


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
        _installed = True
