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
    world_size: int = 1  # ranks per stage, all nodes together; > 1 launches the worker under torchrun
    # Beyond one machine (pipeline.launcher): `nnodes` torchrun agents, one per node, world_size / nnodes ranks each,
    # meeting at torchrun's c10d rendezvous on `rdzv_endpoint` ("host:port", reachable from every node). Each node
    # runs the same `doit` with its own ALIGN_NODE_RANK (0 = the node whose launcher writes the receipts); runs/
    # must be one shared filesystem (global rank 0 writes checkpoints and final/ wherever it runs).
    nnodes: int = 1
    rdzv_endpoint: str = ""

    def __post_init__(self):
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")
        if self.nnodes < 1 or self.world_size % self.nnodes:
            raise ValueError(f"nnodes ({self.nnodes}) must be >= 1 and divide world_size ({self.world_size})")
        if self.nnodes > 1:
            host, _, port = self.rdzv_endpoint.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"nnodes = {self.nnodes} needs rdzv_endpoint = \"host:port\" (torchrun's c10d "
                                 f"rendezvous), got {self.rdzv_endpoint!r}")


@dataclass(frozen=True, kw_only=True)
class CommonConfig:
    run: RunConfig = field(default_factory=RunConfig)
    preflight: PreflightConfig = field(default_factory=PreflightConfig)
    lock: LockConfig = field(default_factory=LockConfig)
    supervisor: SupervisorConfig = field(default_factory=SupervisorConfig)
