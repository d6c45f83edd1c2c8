"""The control plane inside the Trainer: rank-local facts become actions only after every rank agrees.

The failure prevented: one rank acting alone (exiting on SIGTERM, raising on a NaN, halting on a tripwire) while its
peers wait in the next collective, which is not a crash but a hang until the process-group timeout. So a signal
handler only records the signal; the wall clock, a non-finite loss, a skipped step and a tripwire verdict are only
flags; and at each optimizer-step boundary, a point every rank reaches, one MAX all-reduce of

    [signalled (signal number), wall_spent, nonfinite, skipped, tripwire]

turns them into one decision taken by every rank together (`agree`). A halt is announced by rank 0 writing
`<run_dir>/HALT.json` (torchrun reports exit 1 for any failed worker, so the code alone would be lost), then a
barrier, then the same `HaltError` on every rank (`halt_together`)."""

from __future__ import annotations

import signal
import threading
from dataclasses import dataclass

from align.exceptions import HaltError
from align.exit_codes import write_halt_marker
from align.utils.dist import all_gather_object, all_reduce_max, barrier, is_rank0


class StopSignals:
    """While entered, SIGTERM and SIGINT only set `signum` (the last one received); the previous handlers come back
    on exit. A second SIGINT during the final checkpoint therefore cannot interrupt the save."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.signum = 0
        self._old: dict[int, object] = {}

    def _handle(self, signum, _frame) -> None:
        self.signum = signum  # NOTE: nothing else here: no I/O, no raise, no collective

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():  # handlers can only be set from the main thread
            for sig in self.SIGNALS:
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()


@dataclass(frozen=True)
class Flags:
    """What one rank knows at a step boundary; after `agree`, what all ranks know."""

    signalled: int = 0  # signal number, 0 = none
    wall_spent: bool = False
    nonfinite: bool = False  # a micro-batch loss of the window was NaN/inf
    skipped: bool = False  # the optimizer step was not applied
    tripwire: bool = False  # a probe asks to halt


def agree(local: Flags) -> Flags:
    """The boundary's one MAX all-reduce. NOTE: every rank must call it once per boundary, or the run hangs."""
    v = all_reduce_max([local.signalled, local.wall_spent, local.nonfinite, local.skipped, local.tripwire])
    return Flags(int(v[0]), bool(v[1]), bool(v[2]), bool(v[3]), bool(v[4]))


class SkipTracker:
    """Counts bad boundaries (skipped step or non-finite loss) from agreed flags, so every rank counts the same."""

    def __init__(self, max_consecutive: int, max_fraction: float, fraction_after: int):
        self.max_consecutive, self.max_fraction, self.fraction_after = max_consecutive, max_fraction, fraction_after
        self.consecutive = self.bad = self.boundaries = 0

    def record(self, flags: Flags) -> None:
        bad = flags.skipped or flags.nonfinite
        self.boundaries += 1
        self.bad += int(bad)
        self.consecutive = self.consecutive + 1 if bad else 0

    def verdict(self) -> str | None:
        """Why the run must halt (exit 81), or None."""
        if self.consecutive > self.max_consecutive:
            return (f"{self.consecutive} consecutive skipped steps (non-finite loss or gradient) exceed "
                    f"train.max_consecutive_skipped_steps = {self.max_consecutive}")
        if self.boundaries >= self.fraction_after and self.bad / self.boundaries > self.max_fraction:
            return (f"{self.bad} of {self.boundaries} steps skipped ({self.bad / self.boundaries:.1%}) exceed "
                    f"train.max_skipped_fraction = {self.max_fraction:.1%}")
        return None

    def state_dict(self) -> dict:
        return {"consecutive": self.consecutive, "bad": self.bad, "boundaries": self.boundaries}

    def load_state_dict(self, state: dict) -> None:
        self.consecutive, self.bad, self.boundaries = state["consecutive"], state["bad"], state["boundaries"]


def agreed_reason(local_reason: str | None) -> str:
    """Every rank's reason, joined in rank order: the same text on every rank (collective)."""
    reasons = all_gather_object(local_reason)
    return "; ".join(f"rank {r}: {text}" for r, text in enumerate(reasons) if text) or "no rank gave a reason"


def halt_together(run_dir, code: int, reason: str) -> None:
    """Rank 0 writes HALT.json, all ranks meet, every rank raises the same HaltError. Call on every rank."""
    if is_rank0():
        write_halt_marker(run_dir, code, reason)
    barrier()  # NOTE: no rank may exit (and make torchrun kill rank 0) before the marker is on disk
    raise HaltError(reason, code)
