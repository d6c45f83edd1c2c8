"""Typed configs of the inference engine: `SamplingParams` (one per request) and `EngineConfig` (one per engine).

Both are frozen dataclasses so a TOML table maps onto them (align.config) and so nothing mutates a request's
parameters after the engine has accepted it."""

from __future__ import annotations

from dataclasses import dataclass

LINEAR_KERNELS = ("auto", "torch", "onednn", "native")  # EngineConfig.linear_kernel (fused_layers.py)
CPU_KERNELS = ("auto", "torch", "native")  # EngineConfig.cpu_kernels (paged_attention.py, sampler.py)


@dataclass(frozen=True)
class SamplingParams:
    """How one request is decoded. Warpers apply in transformers' order: temperature, then top-k, then top-p."""

    temperature: float = 1.0  # 0.0 = greedy (argmax); its sampling log-prob is 0 (a point mass)
    top_k: int = 0  # 0 = off; else keep the k highest logits (ties at the k-th value are kept, as transformers)
    top_p: float = 1.0  # 1.0 = off; else the smallest set of tokens whose probability reaches top_p
    max_new_tokens: int = 128
    stop_token_ids: tuple[int, ...] = ()  # a sampled stop token ends the sequence and is part of its output

    def __post_init__(self):
        problems = []
        if not self.temperature >= 0.0:
            problems.append(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            problems.append(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            problems.append(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            problems.append(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if problems:
            raise ValueError("SamplingParams: " + "; ".join(problems))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class EngineConfig:
    """KV cache geometry and scheduling limits of one `Engine`."""

    block_size: int = 16  # tokens per KV block; prefix sharing works at this granularity
    max_num_seqs: int = 256  # sequences running at once (decode batch size bound)
    max_num_batched_tokens: int = 2048  # tokens processed per step: bounds prefill chunk size and step memory
    max_model_len: int | None = None  # prompt + output bound; None = the model's max_position_embeddings
    num_blocks: int | None = None  # KV blocks; None = enough for max_num_seqs full-length sequences, capped below
    kv_cache_max_mb: int = 512  # cap on the automatically sized KV cache (the cache is zero-filled up front)
    enable_prefix_caching: bool = True  # share computed prompt blocks between sequences with the same prefix
    seed: int = 0  # base of the per-request seed for requests that bring none
    # Pad each step's matmuls to row counts whose rounding matches any larger batch (measured on the host when the
    # engine first steps, row_invariance.py), and "torch" attention calls to >= 4 query rows. With it, and block_size
    # a multiple of 16 (attention keys then come in whole 16-key chunks), a sequence's tokens and log-probs are
    # bitwise the same alone or in any batch; without it they can differ in the last bits, and a greedy near-tie
    # can flip. Costs the padded rows at small batches (oneDNN: none on an AMD EPYC; MKL: 1-3 rows there, up to 15
    # on an Intel Xeon) and a one-off probe of the kernels (~0.1-1 s for the tiny/small shapes in fp32).
    batch_invariant: bool = True
    # Matmul kernel of the projections and the head (fused_layers.py): "auto" = "native" for float32 weights on a
    # CPU where align's C kernel builds, else "onednn" for float32/bfloat16 weights on a CPU with oneDNN, else
    # "torch"; "torch" = F.linear, the model's own kernel (MKL sgemm in fp32 on CPU); "onednn" = weights pre-packed
    # once by oneDNN (CPU only): 2.5x faster than MKL on the fp32 32k head at 16 rows on an AMD EPYC, whose MKL runs
    # no AVX-512 path; "native" = align/kernels/csrc/linear.c on weights packed into 16-column panels (fp32, CPU):
    # reads cold weights near the core's bandwidth where oneDNN's small-M kernels do not (decode steps), on par with
    # oneDNN at 128 rows, and rounds a row the same in any batch (no padding). Both packed kernels round the last
    # bits differently from the model's forward (within 1e-5 on the log-probs, tests/inference) and keep a packed
    # copy of every weight (repacked after a weight update); "torch" gives the forward's own bits and shares the
    # model's o/down/head weights (only q/k/v and gate/up are fused copies) where that memory or those bits matter.
    linear_kernel: str = "auto"
    # The engine's own C kernels (align/kernels/csrc, built by align/kernels/native.py with a C compiler on PATH or
    # in $CC): "native" = paged attention that reads every token's keys and values from their blocks in place, one
    # call per layer for the whole step (paged_attention.c), and the sampler's row reductions (sampling.c: argmax +
    # logsumexp of greedy rows, exp weights + chunk masses of sampled rows) in one pass each; "torch" = torch ops:
    # gather each sequence's blocks into a padded tensor, then F.scaled_dot_product_attention, and the sampler's
    # torch passes (CUDA's path). "auto" = "native" for a CPU model with head_dim and block_size multiples of 16
    # where the kernels build, else "torch". Both are batch invariant; they round differently (attention outputs
    # within ~1e-6, log-probs within ~1e-6).
    cpu_kernels: str = "auto"

    def __post_init__(self):
        problems = []
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens", "kv_cache_max_mb"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_model_len is not None and self.max_model_len < 2:
            problems.append(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.num_blocks is not None and self.num_blocks < 1:
            problems.append(f"num_blocks must be >= 1, got {self.num_blocks}")
        if self.linear_kernel not in LINEAR_KERNELS:
            problems.append(f"linear_kernel must be one of {LINEAR_KERNELS}, got {self.linear_kernel!r}")
        if self.cpu_kernels not in CPU_KERNELS:
            problems.append(f"cpu_kernels must be one of {CPU_KERNELS}, got {self.cpu_kernels!r}")
        if problems:
            raise ValueError("EngineConfig: " + "; ".join(problems))
