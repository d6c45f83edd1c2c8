"""Metrics history (JSONL, one row per step, the same columns in every row) and a one-line progress display.

Stdlib only. Rank 0 writes; other ranks get a history object that drops rows, so call sites need no rank checks.
A history row is written with one `write` of a whole line and flushed, so a crash leaves at most one torn last line,
which `MetricsHistory` drops when it reopens the file (the supervisor reads the file while the worker runs)."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterable, TextIO

from align.utils.fsio import atomic_write_text, disk_errors

STEP = "step"


def _finite_or_none(value: Any) -> Any:
    # NOTE: JSON has no NaN; a non-finite metric is written as null so every reader can parse every row.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def read_history(path: str | os.PathLike) -> list[dict]:
    """Complete rows of a history file (a torn last line, from a writer that died mid-write, is skipped)."""
    return _read(Path(path))[0]


def _read(path: Path) -> tuple[list[dict], int]:
    """(complete rows, byte length of the prefix they occupy)."""
    if not path.is_file():
        return [], 0
    rows, valid = [], 0
    for line in path.read_bytes().splitlines(keepends=True):
        if not line.endswith(b"\n"):
            break
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break
        valid += len(line)
    return rows, valid


def last_step(path: str | os.PathLike) -> int | None:
    rows = read_history(path)
    return int(rows[-1][STEP]) if rows else None


class MetricsHistory:
    """Append-only JSONL history. The first row fixes the columns (or pass `columns`); a later row may leave a
    column out (written as null) but may not add one, so every row has the same columns."""

    def __init__(self, path: str | os.PathLike, columns: Iterable[str] | None = None, enabled: bool = True):
        self.path = Path(path)
        self.enabled = enabled
        self.columns: tuple[str, ...] | None = tuple(columns) if columns is not None else None
        if self.columns is not None and STEP not in self.columns:
            self.columns = (STEP, *self.columns)
        self._given = self.columns
        if enabled:
            self._repair()

    def _repair(self) -> None:
        rows, valid = _read(self.path)
        if self.path.is_file() and self.path.stat().st_size != valid:
            self._rewrite(rows)  # drop a torn tail so appends start on a line boundary
        if rows and self.columns is None:
            self.columns = tuple(rows[0])

    def _rewrite(self, rows: list[dict]) -> None:
        atomic_write_text(self.path, "".join(_line(r) for r in rows))

    def truncate_after(self, step: int) -> None:
        """Drop rows with step > `step` (a resume from an earlier checkpoint replays those steps)."""
        if self.enabled and self.path.is_file():
            kept = [r for r in read_history(self.path) if r[STEP] <= step]
            self._rewrite(kept)
            if not kept:  # a fresh run (another config may log other columns) fixes its own column set
                self.columns = self._given

    def log(self, step: int, metrics: dict[str, Any]) -> dict | None:
        if not self.enabled:
            return None
        if self.columns is None:
            self.columns = (STEP, *[k for k in metrics if k != STEP])
        extra = [k for k in metrics if k not in self.columns]
        if extra:
            raise ValueError(f"{self.path}: metric {extra[0]!r} is not a column of this history "
                             f"(columns: {', '.join(self.columns)}); every row must have the same columns")
        row = {c: _finite_or_none(metrics.get(c)) for c in self.columns}
        row[STEP] = int(step)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = _line(row)
        with disk_errors(self.path, len(line.encode())):  # a torn tail is repaired at the next open
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line)
                f.flush()
        return row


def _line(row: dict) -> str:
    return json.dumps(row, allow_nan=False) + "\n"


def _fmt_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


class ProgressDisplay:
    """`step/total | tok/s | loss | ETA` on one terminal line, redrawn at most `redraw_s` apart; when the stream
    is not a terminal (a log file, CI), a plain line every `plain_every_s` seconds and at the last step."""

    def __init__(self, total: int, stream: TextIO | None = None, *, is_tty: bool | None = None,
                 redraw_s: float = 0.2, plain_every_s: float = 30.0, label: str = "", clock=time.monotonic):
        self.total = total
        self.stream = stream if stream is not None else sys.stdout
        self.is_tty = is_tty if is_tty is not None else bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = redraw_s if self.is_tty else plain_every_s
        self.label = label
        self._clock = clock
        self._start = clock()
        self._start_step: int | None = None
        self._tokens = 0
        self._last_emit = -math.inf
        self._width = 0

    def format(self, step: int, loss: float | None = None) -> str:
        elapsed = self._clock() - self._start
        done = step - (self._start_step or 0)
        parts = [f"{self.label} " if self.label else "", f"step {step}/{self.total}"]
        if self._tokens and elapsed > 0:
            parts.append(f" | {self._tokens / elapsed:,.0f} tok/s")
        if loss is not None:
            parts.append(f" | loss {loss:.4f}")
        if done > 0 and elapsed > 0:
            parts.append(f" | ETA {_fmt_duration((self.total - step) * elapsed / done)}")
        return "".join(parts)

    def update(self, step: int, *, tokens: int = 0, loss: float | None = None) -> None:
        """Record `tokens` processed since the last update; redraw if due (always at the final step)."""
        if self._start_step is None:
            self._start_step = step - 1  # the first update counts as one step of progress
        self._tokens += tokens
        now = self._clock()
        if now - self._last_emit < self.interval and step < self.total:
            return
        self._last_emit = now
        line = self.format(step, loss)
        if self.is_tty:
            pad = max(self._width - len(line), 0)
            self._width = len(line)
            self.stream.write("\r" + line + " " * pad)
            if step >= self.total:
                self.stream.write("\n")
                self._width = 0
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.is_tty and self._width:
            self.stream.write("\n")
            self.stream.flush()
            self._width = 0
