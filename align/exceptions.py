"""Shared error types. Input errors carry what a user needs to fix the input: the file, key or row, and
what was expected. Halts carry the exit code the supervisor contract (align.exit_codes) assigns to them."""

from __future__ import annotations


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


class PreflightRefused(ExitCodeError):
    """The host is not fit for a heavy job now (memory, disk, load, lock held). Exit 83."""

    def __init__(self, message: str):
        from align.exit_codes import PREFLIGHT_REFUSED

        super().__init__(message, PREFLIGHT_REFUSED)
