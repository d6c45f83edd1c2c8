"""The native rollout backend: the align inference `Engine`, in this process.

`submit` queues requests and returns a ticket; `collect(ticket)` generates them and returns the batch. Generation
happens at collect time, on the weights loaded then, which every result records (`weight_version`). The split is
the seam for overlapping generation of batch N+1 with training on batch N: a backend that owns another device (or a
worker thread) generates between the two calls, and the trainer's code does not change.

Weight updates copy tensors into the engine's model in memory (no checkpoint round trip) and bump the version."""

from __future__ import annotations

import time
from collections import Counter
from typing import Mapping, Sequence

import torch

from align.inference.config import EngineConfig
from align.inference.engine import Engine
from align.inference.sequence import GenerationRequest, derive_seed
from align.rollout.protocol import RolloutBatch, RolloutMetrics, RolloutRequest, RolloutResult


class NativeRolloutClient:
    def __init__(self, model: torch.nn.Module, config: EngineConfig = EngineConfig(), seed: int = 0,
                 vocab_limit: int | None = None):
        self.engine = Engine(model, config, vocab_limit)  # vocab_limit: the tokenizer's size (Engine)
        self.seed = seed
        self._pending: dict[int, list[RolloutRequest]] = {}
        self._next_ticket = 0

    @property
    def weight_version(self) -> int:
        return self.engine.weight_version

    def submit(self, requests: Sequence[RolloutRequest]) -> int:
        ticket = self._next_ticket
        self._next_ticket += 1
        self._pending[ticket] = list(requests)
        return ticket

    def collect(self, ticket: int) -> RolloutBatch:
        if ticket not in self._pending:
            raise KeyError(f"collect: unknown or already collected ticket {ticket}")
        requests = self._pending.pop(ticket)
        flat = [(r, k) for r in requests for k in range(r.num_samples)]
        gen = [GenerationRequest(r.prompt_ids, r.params, self._sample_seed(ticket, i, r, k))
               for i, (r, k) in enumerate(flat)]
        stats0 = _snapshot(self.engine)
        t0 = time.perf_counter()
        outs = self.engine.generate(gen)
        wall = time.perf_counter() - t0
        version = self.engine.weight_version
        results = tuple(
            RolloutResult(r.request_id, k, tuple(r.prompt_ids), tuple(o.token_ids), tuple(o.logprobs),
                          tuple(o.model_logprobs), o.finish_reason, version, o.error)
            for (r, k), o in zip(flat, outs))
        return RolloutBatch(results, self._metrics(requests, results, stats0, wall, version))

    def generate(self, requests: Sequence[RolloutRequest]) -> RolloutBatch:
        return self.collect(self.submit(requests))

    def update_weights(self, state_dict: Mapping, version: int | None = None) -> int:
        return self.engine.load_weights(dict(state_dict), version)

    def update_adapters(self, state_dict: Mapping, version: int | None = None) -> int:
        """The LoRA adapters alone, into an engine over a LoRA-wrapped base (Engine.load_adapters)."""
        return self.engine.load_adapters(dict(state_dict), version)

    def close(self) -> None:
        self._pending.clear()

    def _sample_seed(self, ticket: int, index: int, request: RolloutRequest, k: int) -> int:
        if request.seed is not None:
            return derive_seed(request.seed, k)
        return derive_seed(self.seed, ticket, index)

    def _metrics(self, requests, results, stats0, wall: float, version: int) -> RolloutMetrics:
        s = self.engine.stats
        ok = [r for r in results if r.error is None]
        return RolloutMetrics(
            num_requests=len(requests), num_samples=len(results), num_errors=len(results) - len(ok),
            prompt_tokens=sum(len(r.prompt_ids) for r in ok),
            cached_prompt_tokens=s.cached_tokens - stats0["cached_tokens"],
            generated_tokens=s.generated_tokens - stats0["generated_tokens"],
            steps=s.steps - stats0["steps"], preemptions=s.preemptions - stats0["preemptions"], wall_s=wall,
            weight_version=version, finish_reasons=dict(Counter(r.finish_reason for r in results)))


def _snapshot(engine: Engine) -> dict[str, int]:
    s = engine.stats
    return {"cached_tokens": s.cached_tokens, "generated_tokens": s.generated_tokens, "steps": s.steps,
            "preemptions": s.preemptions}
