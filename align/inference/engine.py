"""`Engine`: continuous-batching generation over an align Mistral model with a paged, prefix-shared KV cache.

The facade only wires the parts (nano-vllm's split): `sequence` (state), `block_manager` (KV blocks and the prefix
cache), `scheduler` (what runs next), `model_runner` (forward + sampling), `sampler` (tokens and log-probs).
A request that cannot run (empty prompt, token ids outside the vocabulary, a prompt that fills the context, a
request larger than the whole cache) gets an error result of its own; the others run as if it were not there.

Determinism: with `batch_invariant` (the default) and a block size that is a multiple of 16, a request's tokens and
log-probs are bitwise the same whatever else is in the batch, in which order, however its prompt is chunked, and
whether it was preempted or took its prefix from the cache (tests/inference/test_engine.py proves it on CPU; it
rests on properties of the host's GEMM kernels, measured on the host when the engine first steps, see
row_invariance.py and ModelRunner.pad_rows; the "native" attention kernel computes every token on its own in a fixed
order, and the "torch" one relies on SDPA's 4-query-row floor, see paged_attention.py)."""

from __future__ import annotations

import numbers
import time
from dataclasses import dataclass
from typing import Sequence as Seq

import torch

from align.inference.block_manager import BlockManager
from align.inference.config import EngineConfig
from align.inference.model_runner import ModelRunner
from align.inference.scheduler import Scheduler
from align.inference.sequence import GenerationRequest, GenerationResult, Sequence, derive_seed
from align.lora.adapters import ADAPTER_KEYS


@dataclass
class EngineStats:
    """Counters since the engine was built (or `reset_stats`)."""

    steps: int = 0
    prompt_tokens: int = 0  # prompt tokens of admitted requests
    cached_tokens: int = 0  # prompt tokens served from the prefix cache instead of computed
    computed_tokens: int = 0  # tokens run through the model (prefill chunks, decode, recomputation)
    generated_tokens: int = 0
    preemptions: int = 0
    peak_blocks_used: int = 0
    wall_s: float = 0.0


class Engine:
    def __init__(self, model: torch.nn.Module, config: EngineConfig = EngineConfig(), vocab_limit: int | None = None):
        """`vocab_limit`: the tokenizer's vocabulary size. A head padded past it (OLMoE-1B-7B: 50,304 rows for 50,280
        tokens) has rows with no piece; ids at and above the limit are never sampled (their logits are -inf before
        sampling, so log-probs are over the tokenizer's ids, as vLLM does). None, or a limit at or above the model's
        vocab_size, masks nothing."""
        self.config = config
        self.model = model  # not .eval(): a model shared with a trainer keeps its mode (nothing here depends on it)
        mcfg = model.config
        self.max_model_len = config.max_model_len or mcfg.max_position_embeddings
        self.vocab_size = mcfg.vocab_size
        if vocab_limit is not None and vocab_limit < 1:
            raise ValueError(f"Engine: vocab_limit must be a positive vocabulary size, got {vocab_limit}")
        self.vocab_limit = min(vocab_limit or mcfg.vocab_size, mcfg.vocab_size)
        num_blocks = config.num_blocks or self._auto_num_blocks(mcfg)
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(config, self.block_manager)
        self.runner = ModelRunner(model, num_blocks, config.block_size, config.batch_invariant, config.linear_kernel,
                                  config.cpu_kernels, self.vocab_limit)
        self.weight_version = 0
        self._weights_stamp = self._stamp()
        self.stats = EngineStats()
        self._next_seq_id = 0
        self._calls = 0

    @property
    def linear_kernel(self) -> str:
        """The matmul kernel this engine runs ("onednn" or "torch"; EngineConfig.linear_kernel "auto" resolved)."""
        return self.runner.decoder.kernel

    @property
    def cpu_kernels(self) -> str:
        """The attention and sampling kernels this engine runs ("native" or "torch"; EngineConfig.cpu_kernels
        "auto" resolved)."""
        return self.runner.cpu_kernels

    def _auto_num_blocks(self, mcfg) -> int:
        per_block = ModelRunner.bytes_per_block(mcfg, self.config.block_size, self.model.lm_head.weight.dtype)
        wanted = self.config.max_num_seqs * -(-self.max_model_len // self.config.block_size)
        return max(1, min(wanted, self.config.kv_cache_max_mb * 2**20 // per_block))

    # ------------------------------------------------------------------------------------------------ requests

    def validate(self, req: GenerationRequest) -> str | None:
        """Why this request cannot run, or None."""
        prompt = req.prompt_ids
        if len(prompt) == 0:
            return "empty prompt"
        bad = [t for t in prompt if not isinstance(t, numbers.Integral) or not 0 <= t < self.vocab_size]
        if bad:
            return f"prompt token {bad[0]!r} is not an int in [0, {self.vocab_size})"
        if len(prompt) >= self.max_model_len:
            return (f"prompt of {len(prompt)} tokens leaves no room to generate: max_model_len is "
                    f"{self.max_model_len}")
        longest = min(len(prompt) + req.params.max_new_tokens, self.max_model_len)
        need = self.block_manager.blocks_for(longest)
        if need > self.block_manager.num_blocks:
            return (f"request needs up to {need} KV blocks of {self.config.block_size} tokens, the cache has "
                    f"{self.block_manager.num_blocks}")
        return None

    def add_request(self, req: GenerationRequest, default_seed: int) -> Sequence:
        seed = req.seed if req.seed is not None else default_seed
        seq = Sequence(self._next_seq_id, list(req.prompt_ids), req.params, seed, self.max_model_len)
        self._next_seq_id += 1
        self.stats.prompt_tokens += seq.num_prompt_tokens
        self.scheduler.add(seq)
        return seq

    # ------------------------------------------------------------------------------------------------ stepping

    def step(self) -> list[Sequence]:
        """One scheduled forward + sampling; returns the sequences that finished in it."""
        plan = self.scheduler.schedule()
        if not plan:
            raise RuntimeError("engine stalled: unfinished sequences but nothing schedulable (a bug)")
        self.stats.peak_blocks_used = max(self.stats.peak_blocks_used, self.block_manager.num_used_blocks)
        self.runner.copy_blocks(plan.copies)
        inputs = self.runner.prepare(plan)
        hidden = self.runner.forward(inputs)
        to_sample = self.scheduler.advance(plan)
        finished = []
        if to_sample:
            tokens, logprobs, model_logprobs = self.runner.sample(hidden, inputs.sample_seqs)
            for seq, tok, lp, mlp in zip(inputs.sample_seqs, tokens, logprobs, model_logprobs):
                if seq.append_token(tok, lp, mlp):
                    finished.append(seq)
        self.scheduler.finish(finished)
        self.stats.steps += 1
        self.stats.computed_tokens += sum(plan.num_tokens)
        self.stats.generated_tokens += len(to_sample)
        self.stats.preemptions = self.scheduler.num_preemptions
        self.stats.cached_tokens = self.block_manager.num_cached_tokens
        return finished

    def generate(self, requests: Seq[GenerationRequest]) -> list[GenerationResult]:
        """Run every request to completion; results in request order."""
        t0 = time.perf_counter()
        self._calls += 1
        self.sync_weights()
        results: list[GenerationResult | None] = [None] * len(requests)
        seqs: dict[int, tuple[int, Sequence]] = {}
        for i, req in enumerate(requests):
            error = self.validate(req)
            if error is not None:
                results[i] = GenerationResult(req.request_id, list(req.prompt_ids), [], [], [], "error", error)
            else:
                seq = self.add_request(req, derive_seed(self.config.seed, self._calls, i))
                seqs[seq.seq_id] = (i, seq)
        try:
            while self.scheduler.has_unfinished():
                self.step()
        except BaseException:
            self.scheduler.abort_all()  # leave no half-run sequence behind to leak into the next call
            raise
        for i, seq in seqs.values():
            req = requests[i]
            results[i] = GenerationResult(req.request_id, list(req.prompt_ids), seq.output_ids, seq.logprobs,
                                          seq.model_logprobs, seq.finish_reason)
        self.stats.wall_s += time.perf_counter() - t0
        return results

    # ------------------------------------------------------------------------------------------------ weights

    def _stamp(self) -> tuple:
        return tuple((p._version, p.data_ptr()) for p in self.model.parameters())

    def sync_weights(self) -> bool:
        """Notice weights changed in place since the last call (load_weights, or a trainer stepping a model it
        shares with the engine): refresh the fused copies and drop cached prefixes. True if anything changed."""
        stamp = self._stamp()
        if stamp == self._weights_stamp:
            return False
        self.runner.decoder.refresh()
        self.block_manager.reset_prefix_cache()  # their K/V were computed by the old weights
        self._weights_stamp = stamp
        return True

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int | None = None) -> int:
        """Copy new weights into the running model in place (no checkpoint round trip); returns the new version.

        Every key must match a parameter of the model by name and shape. Cached prefixes are dropped: their K/V
        were computed by the old weights."""
        return self._load(state_dict, dict(self.model.named_parameters(remove_duplicate=False)), version,
                          "load_weights")  # both names of a tied weight

    def load_adapters(self, state_dict: dict[str, torch.Tensor], version: int | None = None) -> int:
        """`load_weights` for a LoRA model (align.lora.adapters.apply_lora): the keys are exactly its adapter tensors
        (`<module>.lora_A.weight` / `.lora_B.weight`, all of them); the frozen base is not touched, so its packed
        copies are not rebuilt (only the adapters', align.lora.decode)."""
        params = {k: p for k, p in self.model.named_parameters() if k.endswith(ADAPTER_KEYS)}
        if not params:
            raise ValueError("load_adapters: the engine's model has no LoRA adapters (align.lora.adapters.apply_lora)")
        return self._load(state_dict, params, version, "load_adapters")

    @torch.no_grad()
    def _load(self, state_dict: dict[str, torch.Tensor], params: dict[str, torch.Tensor], version: int | None,
              what: str) -> int:
        if self.scheduler.has_unfinished():
            raise RuntimeError(f"{what} while sequences are in flight: finish or collect them first")
        unknown = sorted(set(state_dict) - set(params))
        given = {id(params[k]) for k in state_dict if k in params}
        missing = sorted(k for k, p in params.items() if id(p) not in given)
        if unknown or missing:
            raise KeyError(f"{what}: unknown keys {unknown[:5]}, missing keys {missing[:5]}")
        for name, tensor in state_dict.items():
            if tuple(tensor.shape) != tuple(params[name].shape):
                raise ValueError(f"{what}: {name} has shape {tuple(tensor.shape)}, the model "
                                 f"{tuple(params[name].shape)}")
        for name, tensor in state_dict.items():
            params[name].copy_(tensor)
        self.sync_weights()
        self.weight_version = self.weight_version + 1 if version is None else version
        return self.weight_version
