"""Shared error types and the process exit codes they map to. Input errors carry what a user needs to fix the input:
the file, key or row, and what was expected. Halts carry their exit code; align.exit_codes is the runner that turns
an exception into that code (and the HALT marker).

HALT codes are verdicts about the run, not the host: a supervisor must not relaunch them."""

from __future__ import annotations

OK = 0
BAD_INPUT = 2
TRIPWIRE_HALT = 80
NONFINITE_HALT = 81
WALL_BUDGET = 82
PREFLIGHT_REFUSED = 83
DISK_FULL = 84  # a write found no space (ENOSPC), hit a quota (EDQUOT) or a read-only filesystem (EROFS)

HALT_CODES = frozenset({TRIPWIRE_HALT, NONFINITE_HALT, WALL_BUDGET})

NAMES = {
    TRIPWIRE_HALT: "tripwire halt",
    NONFINITE_HALT: "non-finite / skip-cap halt",
    WALL_BUDGET: "wall budget spent",
    PREFLIGHT_REFUSED: "preflight refused",
    DISK_FULL: "disk full",
    BAD_INPUT: "bad input",
}


class AlignInputError(Exception):
    """Bad input (config, data, artifact, checkpoint). Exit code 2, one line, no traceback."""


class ConfigError(AlignInputError):
    """A config file or override is malformed: names the file, table and key."""


class DataError(AlignInputError):
    """A data file is unreadable or violates its schema: names the file, row and column."""


class ArtifactError(AlignInputError):
    """A stage artifact (manifest, shard set, cache) is missing, incomplete or does not match its manifest."""


class CheckpointError(AlignInputError):
    """A checkpoint directory is missing, truncated, or does not fit the model: names the file and key."""


class ExitCodeError(RuntimeError):
    """An error that maps to a specific process exit code (see align.exit_codes)."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


class HaltError(ExitCodeError):
    """A verdict about the run (tripwire, non-finite, skip cap): the supervisor must not relaunch it."""


class DiskFullError(ExitCodeError):
    """A write failed for lack of space (ENOSPC), quota (EDQUOT) or a read-only filesystem (EROFS): names the path,
    the bytes being written and the free space. Exit 84; nothing half-written is left (align.utils.fsio)."""

    def __init__(self, message: str):
        super().__init__(message, DISK_FULL)


class PreflightRefused(ExitCodeError):
    """The host is not fit for a heavy job now (memory, disk, load, lock held). Exit 83."""

    def __init__(self, message: str):
        super().__init__(message, PREFLIGHT_REFUSED)
