"""Tripwires: probes that watch every step and ask for a HALT (exit 80) when training has visibly gone wrong.

Armed by default for SFT. Each probe sees the boundary's global metrics (identical on every rank) or, for the
weight-movement probe, this rank's parameter shard; its verdict is rank-local and becomes a halt only through the
boundary's MAX all-reduce (align.train.control), so every rank raises the same HaltError together.

    grad_norm        pre-clip global gradient norm above `grad_norm_max` for `grad_norm_patience` consecutive
                     steps (clipping hides an exploding norm from the update, not from this probe)
    loss_spike       loss above mean + k * sigma of the last `loss_spike_window` finite losses (once
                     `loss_spike_min_history` are in): logged as `probe/loss_z` and counted as `probe/loss_spikes`;
                     `loss_spike_patience` consecutive spikes halt
    entropy          mean predictive entropy back above `entropy_max_fraction` * ln(vocab) after it had once
                     fallen below `entropy_learned_fraction` * ln(vocab) (a model that had learned something went
                     back to near-uniform: divergence), or below `entropy_min` (collapse); a fresh model starts
                     near-uniform, so the upper check arms only once learning is visible
    weight_movement  relative update ||dw|| / ||w|| of a fixed sample of weights above `weight_update_max`
                     (an explosion), or exactly zero for `weight_stall_patience` applied steps (training nothing)

Non-finite values are not a probe's business: the skip cap (exit 81) owns NaN; probes ignore NaN rather than trip.
Arm-time self-test: each armed probe is fed a synthetic series that must trip it and one that must not; a probe
whose thresholds can never fire (or always fire) is a ConfigError before the first step."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import torch

from align.exceptions import ConfigError
from align.train.callbacks import Callback

PROBES = ("grad_norm", "loss_spike", "entropy", "weight_movement")


@dataclass(frozen=True)
class ProbeConfig:
    """[probes] table."""

    armed: tuple[str, ...] = PROBES
    grad_norm_max: float = 1000.0
    grad_norm_patience: int = 3
    loss_spike_window: int = 50
    loss_spike_sigmas: float = 6.0
    loss_spike_min_history: int = 20
    loss_spike_patience: int = 3
    entropy_max_fraction: float = 0.98
    entropy_learned_fraction: float = 0.5
    entropy_min: float | None = None
    weight_update_max: float = 0.5
    weight_stall_patience: int = 5
    weight_sample: int = 1024  # elements sampled per parameter tensor (strided), per rank
    self_test: bool = True

    def __post_init__(self):
        unknown = sorted(set(self.armed) - set(PROBES))
        if unknown:
            raise ValueError(f"unknown probe {unknown[0]!r}; known: {', '.join(PROBES)}")


def _finite(x) -> bool:
    return x is not None and math.isfinite(x)


class GradNormProbe:
    name = "grad_norm"

    def __init__(self, cfg: ProbeConfig):
        self.cfg, self.run = cfg, 0

    def observe(self, m: dict) -> str | None:
        norm = m.get("grad_norm")
        if not _finite(norm):
            return None
        self.run = self.run + 1 if norm > self.cfg.grad_norm_max else 0
        if self.run >= self.cfg.grad_norm_patience:
            return f"grad_norm {norm:.3g} > {self.cfg.grad_norm_max} for {self.run} consecutive steps"
        return None

    def trial(self):
        bad = [{"grad_norm": self.cfg.grad_norm_max * 10}] * (self.cfg.grad_norm_patience + 1)
        return [{"grad_norm": 1.0}] * 10, bad

    def state_dict(self) -> dict:
        return {"run": self.run}

    def load_state_dict(self, s: dict) -> None:
        self.run = s["run"]


class LossSpikeProbe:
    name = "loss_spike"

    def __init__(self, cfg: ProbeConfig):
        self.cfg = cfg
        self.window: deque[float] = deque(maxlen=cfg.loss_spike_window)
        self.run = self.spikes = 0

    def observe(self, m: dict) -> str | None:
        loss, z = m.get("loss"), math.nan
        if _finite(loss):
            if len(self.window) >= self.cfg.loss_spike_min_history:
                mean = sum(self.window) / len(self.window)
                std = math.sqrt(sum((x - mean) ** 2 for x in self.window) / len(self.window))
                z = (loss - mean) / max(std, 1e-8 * max(abs(mean), 1.0))
            spike = z > self.cfg.loss_spike_sigmas
            self.spikes += int(spike)
            self.run = self.run + 1 if spike else 0
            if not spike:  # NOTE: spikes stay out of the baseline, or a diverging run would raise its own bar
                self.window.append(loss)
        m["probe/loss_z"], m["probe/loss_spikes"] = z, float(self.spikes)
        if self.run >= self.cfg.loss_spike_patience:
            return f"loss {loss:.4g} is {z:.1f} sigma above its recent mean for {self.run} consecutive steps"
        return None

    def trial(self):
        calm = [{"loss": 2.0 + 0.01 * (i % 3)} for i in range(self.cfg.loss_spike_min_history + 5)]
        return calm, calm + [{"loss": 1e4}] * self.cfg.loss_spike_patience

    def state_dict(self) -> dict:
        return {"window": list(self.window), "run": self.run, "spikes": self.spikes}

    def load_state_dict(self, s: dict) -> None:
        self.window.clear()
        self.window.extend(s["window"])
        self.run, self.spikes = s["run"], s["spikes"]


class EntropyProbe:
    name = "entropy"

    def __init__(self, cfg: ProbeConfig, vocab_size: int):
        self.cfg, self.max_entropy = cfg, math.log(vocab_size)
        self.learned = False

    def observe(self, m: dict) -> str | None:
        ent = m.get("entropy")
        if not _finite(ent):
            return None
        self.learned = self.learned or ent < self.cfg.entropy_learned_fraction * self.max_entropy
        limit = self.cfg.entropy_max_fraction * self.max_entropy
        if self.learned and ent > limit:
            return (f"mean entropy {ent:.3f} > {limit:.3f} nats ({self.cfg.entropy_max_fraction} ln V) after it had "
                    "fallen below half of ln V: back to near-uniform")
        if self.cfg.entropy_min is not None and ent < self.cfg.entropy_min:
            return f"mean entropy {ent:.3g} < entropy_min {self.cfg.entropy_min}: collapsed"
        return None

    def trial(self):
        fresh = [{"entropy": self.max_entropy}] * 3  # an untrained model: near-uniform, must not trip
        learned = [{"entropy": 0.3 * self.max_entropy}] * 3
        return fresh + learned, learned + [{"entropy": self.max_entropy}]

    def state_dict(self) -> dict:
        return {"learned": self.learned}

    def load_state_dict(self, s: dict) -> None:
        self.learned = s["learned"]


class WeightMovementProbe:
    name = "weight_movement"

    def __init__(self, cfg: ProbeConfig, params: list[torch.Tensor]):
        self.cfg, self.params = cfg, params
        self.prev = self._sample()
        self.stalled = 0

    def _sample(self) -> torch.Tensor:
        parts = []
        for p in self.params:
            flat = (p.to_local() if hasattr(p, "to_local") else p).detach().reshape(-1)
            stride = max(1, flat.numel() // self.cfg.weight_sample)
            parts.append(flat[::stride][: self.cfg.weight_sample].float().cpu())
        return torch.cat(parts) if parts else torch.zeros(0)

    def observe(self, m: dict) -> str | None:
        cur = self._sample()
        rel = float((cur - self.prev).norm() / self.prev.norm().clamp_min(1e-12))
        self.prev = cur
        m["probe/weight_update"] = rel
        if m.get("applied", 1.0):
            self.stalled = self.stalled + 1 if rel == 0.0 else 0
        if _finite(rel) and rel > self.cfg.weight_update_max:
            return f"relative weight update {rel:.3g} > {self.cfg.weight_update_max}"
        if self.stalled >= self.cfg.weight_stall_patience:
            return f"weights did not move in {self.stalled} consecutive applied steps"
        return None

    def trial(self):
        return None  # tested through a synthetic parameter in `self_test`

    def state_dict(self) -> dict:
        return {"stalled": self.stalled}  # the sample itself is re-taken from the restored weights

    def load_state_dict(self, s: dict) -> None:
        self.stalled = s["stalled"]


def _trip(probe, series: list[dict]) -> bool:
    return any(probe.observe(dict(m)) is not None for m in series)


def self_test(probe_factory, cfg: ProbeConfig) -> None:
    """A fresh probe must stay quiet on the calm series and trip on the bad one."""
    name = probe_factory(cfg).name
    if name == "weight_movement":
        w = torch.nn.Parameter(torch.ones(64))
        probe = WeightMovementProbe(cfg, [w])
        with torch.no_grad():
            w.add_(1e-3)
        quiet = probe.observe({"applied": 1.0}) is None
        with torch.no_grad():
            w.mul_(1.0 + 10 * cfg.weight_update_max)
        ok = quiet and probe.observe({"applied": 1.0}) is not None
    else:
        good, bad = probe_factory(cfg).trial()
        ok = not _trip(probe_factory(cfg), good) and _trip(probe_factory(cfg), bad)
    if not ok:
        raise ConfigError(f"[probes] self-test of {name!r} failed: with these thresholds it cannot tell a healthy "
                          "run from a broken one")


class Tripwires(Callback):
    """The armed probes as one callback; their state rides in resume.pt so a resumed run judges the same."""

    name = "tripwires"

    def __init__(self, cfg: ProbeConfig, params: list[torch.Tensor], vocab_size: int):
        factories = {"grad_norm": GradNormProbe, "loss_spike": LossSpikeProbe,
                     "entropy": lambda c: EntropyProbe(c, vocab_size),
                     "weight_movement": lambda c: WeightMovementProbe(c, params)}
        if cfg.self_test:
            for name in cfg.armed:
                self_test(factories[name], cfg)
        self.probes = [factories[name](cfg) for name in cfg.armed]
        self.columns = {"probe/loss_z": math.nan, "probe/loss_spikes": math.nan, "probe/weight_update": math.nan}

    def observe(self, trainer, metrics: dict) -> str | None:
        metrics.update(self.columns)
        reasons = [f"{p.name}: {r}" for p in self.probes if (r := p.observe(metrics)) is not None]
        return "; ".join(reasons) or None

    def state_dict(self) -> dict:
        return {p.name: p.state_dict() for p in self.probes if hasattr(p, "state_dict")}

    def load_state_dict(self, state: dict) -> None:
        for p in self.probes:
            if p.name in state and hasattr(p, "load_state_dict"):
                p.load_state_dict(state[p.name])
