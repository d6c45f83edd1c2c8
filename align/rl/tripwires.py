"""GRPO health tripwires: watch each step's global metrics and ask for a HALT (exit 80) when RL has gone wrong in a
way the loss does not show.

    entropy          mean token entropy of the sampled completions below `entropy_min` (the policy collapsed to
                     near-deterministic output: exploration is gone) or above `entropy_max` (near-uniform
                     gibberish), for `entropy_patience` consecutive steps; with `[loss] zero_gradient_rows =
                     "skip"` the completions that went through the training forward (align.rl.zero_rows: under
                     negative_scale 0 mostly the correct ones, which sample lower entropy than the wrong ones)
    ratio            the policy ratio's mean strays from 1 by more than `ratio_max_dev` (the update is far larger
                     than the clip allows for), or the train/infer mismatch mean |log rho| exceeds
                     `rho_max_abs_log` (sampler and trainer disagree about the policy), for `ratio_patience` steps
    reward_collapse  the step's reward mean falls below the baseline (mean of the last `collapse_window` healthy
                     steps, once `collapse_min_history` are in) by more than `collapse_margin`, for
                     `collapse_patience` consecutive steps; then the latch closes and stays closed (a resumed run
                     that had collapsed halts again at once instead of forgetting)

`GrpoHealth` holds the state (windows, runs, the latch) and lives in the GrpoTrainModule, whose extra_state saves it;
`HealthCallback` hands the Trainer its verdict, which counts only after the boundary's MAX all-reduce. Every input
is a global metric (identical on every rank), so every rank reaches the same verdict anyway."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from align.train.callbacks import Callback

TRIPWIRES = ("entropy", "ratio", "reward_collapse")


@dataclass(frozen=True)
class HealthConfig:
    """[health] table."""

    armed: tuple[str, ...] = TRIPWIRES
    entropy_min: float = 0.02  # nats per token
    entropy_max: float | None = None  # None: off
    entropy_patience: int = 3
    ratio_max_dev: float = 0.5
    rho_max_abs_log: float = 0.5
    ratio_patience: int = 2
    collapse_window: int = 10
    collapse_min_history: int = 5
    collapse_margin: float = 0.3  # absolute drop of the reward mean below the baseline
    collapse_patience: int = 3

    def __post_init__(self):
        unknown = sorted(set(self.armed) - set(TRIPWIRES))
        if unknown:
            raise ValueError(f"unknown tripwire {unknown[0]!r}; known: {', '.join(TRIPWIRES)}")
        for name in ("entropy_patience", "ratio_patience", "collapse_window", "collapse_min_history",
                     "collapse_patience"):
            if getattr(self, name) < 1:
                raise ValueError(f"HealthConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.collapse_min_history > self.collapse_window:
            raise ValueError("HealthConfig.collapse_min_history must not exceed collapse_window")


def _finite(x) -> bool:
    return x is not None and math.isfinite(x)


class GrpoHealth:
    def __init__(self, cfg: HealthConfig = HealthConfig()):
        self.cfg = cfg
        self.entropy_run = self.ratio_run = self.collapse_run = 0
        self.window: deque[float] = deque(maxlen=cfg.collapse_window)
        self.latched = False  # the reward collapsed; stays set for the rest of the run, resume included

    def observe(self, m: dict) -> str | None:
        """Update from one step's metrics; the first reason to halt, or None. Adds `health/reward_baseline`."""
        reasons = [r for r in (self._entropy(m), self._ratio(m), self._collapse(m)) if r]
        return "; ".join(reasons) or None

    def _entropy(self, m: dict) -> str | None:
        ent = m.get("entropy")
        if "entropy" not in self.cfg.armed or not _finite(ent):
            return None
        bad = ent < self.cfg.entropy_min or (self.cfg.entropy_max is not None and ent > self.cfg.entropy_max)
        self.entropy_run = self.entropy_run + 1 if bad else 0
        if self.entropy_run >= self.cfg.entropy_patience:
            return (f"entropy {ent:.4f} nats outside [{self.cfg.entropy_min}, {self.cfg.entropy_max}] for "
                    f"{self.entropy_run} steps")
        return None

    def _ratio(self, m: dict) -> str | None:
        ratio, rho = m.get("ratio_mean"), m.get("rho_abs_log_mean")
        if "ratio" not in self.cfg.armed:
            return None
        dev = abs(ratio - 1.0) if _finite(ratio) else 0.0
        mismatch = rho if _finite(rho) else 0.0
        bad = dev > self.cfg.ratio_max_dev or mismatch > self.cfg.rho_max_abs_log
        self.ratio_run = self.ratio_run + 1 if bad else 0
        if self.ratio_run >= self.cfg.ratio_patience:
            return (f"policy ratio mean {ratio:.3f} (limit 1 +- {self.cfg.ratio_max_dev}) or train/infer mismatch "
                    f"mean |log rho| {mismatch:.3f} (limit {self.cfg.rho_max_abs_log}) for {self.ratio_run} steps")
        return None

    def baseline(self) -> float:
        return sum(self.window) / len(self.window) if len(self.window) >= self.cfg.collapse_min_history else math.nan

    def _collapse(self, m: dict) -> str | None:
        reward = m.get("reward_mean")
        m["health/reward_baseline"] = base = self.baseline()
        if "reward_collapse" not in self.cfg.armed:
            return None
        if self.latched:
            return f"reward collapsed earlier in this run (baseline {base:.3f}); the latch stays closed"
        if not _finite(reward):
            return None
        if _finite(base) and reward < base - self.cfg.collapse_margin:
            self.collapse_run += 1  # NOTE: a collapsing step stays out of the window, or it would lower its own bar
        else:
            self.collapse_run = 0
            self.window.append(float(reward))
        if self.collapse_run >= self.cfg.collapse_patience:
            self.latched = True
            return (f"reward mean {reward:.3f} below the baseline {base:.3f} - {self.cfg.collapse_margin} for "
                    f"{self.collapse_run} steps")
        return None

    def state_dict(self) -> dict:
        return {"entropy_run": self.entropy_run, "ratio_run": self.ratio_run, "collapse_run": self.collapse_run,
                "window": list(self.window), "latched": self.latched}

    def load_state_dict(self, s: dict) -> None:
        if not s:
            return
        self.entropy_run, self.ratio_run = int(s["entropy_run"]), int(s["ratio_run"])
        self.collapse_run, self.latched = int(s["collapse_run"]), bool(s["latched"])
        self.window.clear()
        self.window.extend(float(x) for x in s["window"])


class HealthCallback(Callback):
    """Asks the module's GrpoHealth for a verdict at every boundary (state saved as the module's extra state)."""

    name = "grpo_health"

    def __init__(self, health: GrpoHealth):
        self.health = health

    def observe(self, trainer, metrics: dict) -> str | None:
        return self.health.observe(metrics)
