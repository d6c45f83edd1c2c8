"""The tables every stage of a profile shares: `configs/<profile>/common.toml` ([run], [preflight], [lock],
[supervisor]).

The pipeline reads common.toml to launch a stage (world size, host preflight, heavy-job lock). A stage config that
`include`s common.toml takes these tables too: its dataclass subclasses `CommonConfig` (fields are keyword-only, so
a subclass may add required fields), and `[run].seed` reaches the worker without repeating it per stage."""

from __future__ import annotations

from dataclasses import dataclass, field

from align.utils.guard import LockConfig, PreflightConfig
from align.utils.supervisor import SupervisorConfig


@dataclass(frozen=True)
class RunConfig:
    seed: int = 0  # the one seed a profile's stages derive their RNG streams from
    world_size: int = 1  # ranks per stage; > 1 launches the worker under torchrun on this host

    def __post_init__(self):
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")


@dataclass(frozen=True, kw_only=True)
class CommonConfig:
    run: RunConfig = field(default_factory=RunConfig)
    preflight: PreflightConfig = field(default_factory=PreflightConfig)
    lock: LockConfig = field(default_factory=LockConfig)
    supervisor: SupervisorConfig = field(default_factory=SupervisorConfig)
