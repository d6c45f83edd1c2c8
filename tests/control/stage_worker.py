"""The SFT stage worker (align.stages.sft) exactly as the launcher runs it, plus a record of what each process did.

    [torchrun ...] tests/control/stage_worker.py --config F [table.key=value ...]

At start it writes its pid to `$CONTROL_DIR/pid_rank<R>` (what an outside killer aims at); when `main` returns it
appends `{"rank", "pid", "code", "step", "resumed"}` to `$CONTROL_DIR/exits.jsonl` (the trainer's last step and the
checkpoint it resumed from; `code` null and `error` set when an exception escapes), then exits with the stage's code. torchrun reports 1 for any failed worker, so this is
how a test learns each rank's own exit code. A process killed by SIGKILL records nothing, as in life."""

from __future__ import annotations

import json
import os
from pathlib import Path

from align.exit_codes import leave, run_with_exit_codes
from align.stages import sft
from align.train.trainer import Trainer

OUT = Path(os.environ["CONTROL_DIR"])
RANK = int(os.environ.get("RANK", "0"))
seen: dict = {}


def _observed_fit(fit):
    def wrapper(self: Trainer) -> int:
        try:
            return fit(self)
        finally:  # also on HaltError: the step it halted at
            seen.update(step=self.step, resumed=self.resumed_from.name if self.resumed_from else None)
    return wrapper


def main() -> None:
    (OUT / f"pid_rank{RANK}").write_text(str(os.getpid()))
    Trainer.fit = _observed_fit(Trainer.fit)
    try:
        code = run_with_exit_codes(sft.main)
    except BaseException as exc:  # an unexpected error (a collective timeout, an injected crash): say which
        _record(code=None, error=f"{type(exc).__name__}: {exc}"[:2000])
        raise
    _record(code=code)
    leave(code)


def _record(**what) -> None:
    with open(OUT / "exits.jsonl", "a") as f:
        f.write(json.dumps({"rank": RANK, "pid": os.getpid(), **what, **seen}) + "\n")


if __name__ == "__main__":
    main()
