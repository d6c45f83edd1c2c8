"""Per-request state: what the caller asks for (`GenerationRequest`), what it gets back (`GenerationResult`), and
the engine's mutable record of one sequence in flight (`Sequence`).

A sequence's tokens are prompt + output. `num_computed_tokens` of them have their keys/values in the KV cache; a
step processes the next ones and, when it reaches the last token, samples one more. Decode is the case where only
the last token is missing, so prefill, chunked prefill, decode and recomputation after preemption are one path."""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass
from typing import Hashable

import torch

from align.inference.config import SamplingParams


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt to continue. `seed` fixes the sampled tokens whatever else is in the batch (None: the engine
    derives one from its config seed, how many `generate` calls it has run and the request's position in this one,
    so an unseeded rerun of the same call samples afresh). Nothing stops a sequence implicitly: put the tokenizer's
    EOS in `params.stop_token_ids`."""

    prompt_ids: tuple[int, ...] | list[int]
    params: SamplingParams = SamplingParams()
    seed: int | None = None
    request_id: Hashable = None


@dataclass(frozen=True)
class GenerationResult:
    """The continuation of one request. `logprobs[i]` is log p(token_ids[i]) under the distribution it was sampled
    from (after temperature/top-k/top-p; 0.0 for greedy), `model_logprobs[i]` under the untempered model.
    `finish_reason` is "stop" (a stop token, included in token_ids), "length" (max_new_tokens or the context
    limit) or "error" (then `error` says why and the token lists are empty)."""

    request_id: Hashable
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    model_logprobs: list[float]
    finish_reason: str
    error: str | None = None


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


def derive_seed(*parts: int) -> int:
    """A 63-bit seed from integers, stable across processes and Python versions (unlike hash())."""
    digest = hashlib.blake2b(repr(tuple(int(p) for p in parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class Sequence:
    """Mutable state of one sequence. Plain attributes (no dataclass) because the scheduler touches them for every
    sequence on every step."""

    __slots__ = ("seq_id", "tokens", "num_prompt_tokens", "params", "uniforms", "block_table",
                 "num_computed_tokens", "num_cached_tokens", "status", "logprobs", "model_logprobs",
                 "finish_reason", "max_len")

    def __init__(self, seq_id: int, prompt_ids: list[int], params: SamplingParams, seed: int, max_len: int):
        self.seq_id = seq_id
        self.tokens = [int(t) for t in prompt_ids]
        self.num_prompt_tokens = len(self.tokens)
        self.params = params
        # The request's whole random stream is drawn up front from its own generator: output token i always uses
        # uniform i, so the samples depend on the seed and the model only, never on batch order or composition.
        # (Inverse-CDF sampling needs exactly one uniform per token; (0, 1] keeps zero-probability tokens out.)
        gen = torch.Generator().manual_seed(seed)
        self.uniforms = (1.0 - torch.rand(params.max_new_tokens, generator=gen, dtype=torch.float64)).tolist()
        self.block_table: list[int] = []
        self.num_computed_tokens = 0  # tokens whose K/V are in the cache
        self.num_cached_tokens = 0  # of those, taken from the prefix cache instead of computed (statistic)
        self.status = SeqStatus.WAITING
        self.logprobs: list[float] = []
        self.model_logprobs: list[float] = []
        self.finish_reason: str | None = None
        self.max_len = max_len  # context limit: prompt + output never exceeds it

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def num_output_tokens(self) -> int:
        return len(self.tokens) - self.num_prompt_tokens

    @property
    def output_ids(self) -> list[int]:
        return self.tokens[self.num_prompt_tokens:]

    @property
    def num_pending_tokens(self) -> int:
        """Tokens still to be run through the model before the next token can be sampled."""
        return len(self.tokens) - self.num_computed_tokens

    def next_uniform(self) -> float:
        return self.uniforms[self.num_output_tokens]

    def append_token(self, token: int, logprob: float, model_logprob: float) -> bool:
        """Record a sampled token; return True when the sequence is finished."""
        self.tokens.append(token)
        self.logprobs.append(logprob)
        self.model_logprobs.append(model_logprob)
        if token in self.params.stop_token_ids:
            self.finish_reason = "stop"
        elif self.num_output_tokens >= self.params.max_new_tokens or len(self.tokens) >= self.max_len:
            self.finish_reason = "length"
        return self.finish_reason is not None

    def reset_for_recompute(self) -> None:
        """After preemption: the cache forgets this sequence; its tokens so far are kept and recomputed later."""
        self.block_table = []
        self.num_computed_tokens = 0
        self.status = SeqStatus.WAITING
