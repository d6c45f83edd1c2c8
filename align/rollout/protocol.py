"""The interface between a trainer and a sampler: plain dataclasses and the client protocol.

Only plain dataclasses of ints, floats and strings cross this seam (no tensors), so an out-of-process backend (a
vLLM worker in its own environment) can speak it too. A trainer submits `RolloutRequest`s (one prompt, G samples),
keeps training, and collects a `RolloutBatch` later: one `RolloutResult` per sample, grouped by request in submission order, each stamped with the
weight version that produced it so a trainer can measure (and bound) staleness."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, Literal, Mapping, Protocol, Sequence

from align.inference.config import EngineConfig, SamplingParams


@dataclass(frozen=True)
class RolloutRequest:
    """One prompt and how many samples of it (GRPO's group size). With `seed` set, sample k is a pure function of
    (weights, prompt, params, seed, k): independent of batching, order and the other requests."""

    prompt_ids: tuple[int, ...]
    num_samples: int = 1
    params: SamplingParams = SamplingParams()
    seed: int | None = None
    request_id: Hashable = None  # echoed back (e.g. the prompt's row in its shard set)

    def __post_init__(self):
        if self.num_samples < 1:
            raise ValueError(f"RolloutRequest.num_samples must be >= 1, got {self.num_samples}")


@dataclass(frozen=True)
class RolloutResult:
    """One sample. `logprobs`: per token under the sampling distribution (the behaviour policy of GRPO's ratio);
    `model_logprobs`: under the untempered model. finish_reason "stop" | "length" | "error" (`error` says why)."""

    request_id: Hashable
    sample_index: int
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    model_logprobs: tuple[float, ...]
    finish_reason: str
    weight_version: int
    error: str | None = None


@dataclass(frozen=True)
class RolloutMetrics:
    num_requests: int
    num_samples: int
    num_errors: int
    prompt_tokens: int  # prompt tokens over all samples (each sample counts its prompt)
    cached_prompt_tokens: int  # of those, served by the prefix cache instead of computed
    generated_tokens: int
    steps: int
    preemptions: int
    wall_s: float
    weight_version: int
    finish_reasons: Mapping[str, int] = field(default_factory=dict)

    @property
    def generated_tokens_per_s(self) -> float:
        return self.generated_tokens / self.wall_s if self.wall_s > 0 else 0.0


@dataclass(frozen=True)
class RolloutBatch:
    results: tuple[RolloutResult, ...]  # request order, then sample order
    metrics: RolloutMetrics


@dataclass(frozen=True)
class RolloutConfig:
    """`[rollout]` table: which backend samples and how its engine is shaped."""

    backend: Literal["native"] = "native"  # in-process align.inference.Engine
    engine: EngineConfig = EngineConfig()
    seed: int = 0  # base of the sample seeds of requests that bring none


class RolloutClient(Protocol):
    """What every backend offers. `submit` returns a ticket at once; `collect(ticket)` returns its batch."""

    @property
    def weight_version(self) -> int: ...

    def submit(self, requests: Sequence[RolloutRequest]) -> int: ...

    def collect(self, ticket: int) -> RolloutBatch: ...

    def generate(self, requests: Sequence[RolloutRequest]) -> RolloutBatch:
        """submit + collect in one call."""
        ...

    def update_weights(self, state_dict: Mapping, version: int | None = None) -> int: ...

    def close(self) -> None: ...
