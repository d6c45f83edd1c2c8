"""`StepClock`: a transformers `TrainerCallback` recording each optimizer step's wall and process-CPU seconds, the
reference side's timer in the benches that run a TRL trainer (dpo_step.py, grpo_step.py). Imported only there,
inside the function that runs TRL: transformers is the oracle extra, never a runtime dependency."""

from __future__ import annotations

import time

from transformers import TrainerCallback


class StepClock(TrainerCallback):
    def __init__(self):
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self._t0 = self._c0 = 0.0

    def on_step_begin(self, *args, **kwargs):
        self._t0, self._c0 = time.perf_counter(), time.process_time()

    def on_step_end(self, *args, **kwargs):
        self.wall.append(time.perf_counter() - self._t0)
        self.cpu.append(time.process_time() - self._c0)
