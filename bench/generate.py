"""Generation throughput of align's Engine vs transformers' `generate`, same weights, same machine, same run.

Loads (generated tokens per second of wall time, prefill included):
  b1    1 prompt of 64 tokens, 128 new tokens, greedy
  b16   16 prompts of 64 tokens, 128 new tokens, greedy
  grpo  16 prompts of 64 tokens x 8 samples each, 64 new tokens, temperature 1 (no top-k/top-p): the GRPO stage's
        shape. The engine gets one request per prompt with 8 samples (prompt prefilled once, blocks shared);
        transformers gets `num_return_sequences=8`, which repeats each prompt 8 times.
Shapes: tiny (the embedded profile: vocab 32768, d 256, 4 layers, 8/2 heads, ffn 768) and small (d 512, 8 layers,
8/2 heads, ffn 1536). Random weights; no stop tokens (transformers with min_new_tokens = max_new_tokens), so both
produce exactly the same number of tokens.

Variants (`--variants`, comma-separated dtype[:linear[:cpu_kernels]]): float32 (the default engine: EngineConfig
linear_kernel and cpu_kernels "auto", which on a CPU are oneDNN's pre-packed weights and align's C kernels for paged
attention and sampling), float32:torch (the model's own F.linear, MKL sgemm in fp32), float32::torch (gather + SDPA
attention and the torch sampler), bfloat16, bfloat16:torch. The kernels the engine ran are printed per variant
(`..._kernel`, `..._cpu_kernels`).
A bf16 variant runs BOTH engines on a bf16 copy of the weights (transformers' twin `.to(torch.bfloat16)`), so every
speedup compares like with like; the align engine computes its log-probs in fp32 from the bf16 logits.

The engine is built once per (shape, load, variant), as the GRPO stage builds its client once, and its prefix cache
is dropped before every timed run, as a weight update drops it: no prompt is ever served from an earlier run.
Runs alternate (align, transformers, ...) so machine noise hits both; best and median of the repeats are printed, as
ONE JSON line, with tokens per CPU-second of the process beside tokens per wall second. Usage:

    .venv/bin/python bench/generate.py [--shapes tiny,small --loads b1,b16,grpo --variants float32,bfloat16:torch
                                        --repeats 3 --threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from model_forward import build_hf  # noqa: E402  (the transformers twin with the same weights)

from align.inference import EngineConfig, SamplingParams  # noqa: E402
from align.inference.config import CPU_KERNELS, LINEAR_KERNELS  # noqa: E402
from align.model import MistralConfig, MistralForCausalLM  # noqa: E402
from align.model.checkpoint import DTYPES  # noqa: E402
from align.rollout import RolloutRequest  # noqa: E402
from align.rollout.native import NativeRolloutClient  # noqa: E402

SHAPES = {
    "tiny": MistralConfig(),
    "small": MistralConfig(hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
                           num_key_value_heads=2),
}
LOADS = {  # prompts, samples per prompt, new tokens, temperature
    "b1": (1, 1, 128, 0.0),
    "b16": (16, 1, 128, 0.0),
    "grpo": (16, 8, 64, 1.0),
}
PROMPT_LEN = 64


def make_client(model, new: int, invariant: bool, linear: str, cpu_kernels: str) -> NativeRolloutClient:
    cfg = EngineConfig(max_model_len=PROMPT_LEN + new + 1, max_num_seqs=256, batch_invariant=invariant,
                       linear_kernel=linear, cpu_kernels=cpu_kernels)
    return NativeRolloutClient(model, cfg)


def run_align(client, prompts, samples: int, new: int, temperature: float) -> tuple[float, float]:
    client.engine.block_manager.reset_prefix_cache()  # what a weight update does: no prompt served from a past run
    params = SamplingParams(temperature=temperature, max_new_tokens=new)
    reqs = [RolloutRequest(tuple(p), num_samples=samples, params=params, seed=i) for i, p in enumerate(prompts)]
    t0, c0 = time.perf_counter(), time.process_time()
    batch = client.generate(reqs)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert sum(len(r.completion_ids) for r in batch.results) == len(prompts) * samples * new
    assert batch.metrics.cached_prompt_tokens == len(prompts) * (samples - 1) * (PROMPT_LEN - 1) or samples == 1
    return len(prompts) * samples * new / wall, len(prompts) * samples * new / cpu


@torch.inference_mode()
def run_hf(twin, prompts, samples: int, new: int, temperature: float) -> tuple[float, float]:
    ids = torch.tensor(prompts)
    kw = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else dict(do_sample=False)
    t0, c0 = time.perf_counter(), time.process_time()
    out = twin.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                        num_return_sequences=samples, pad_token_id=0, **kw)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert out.shape == (len(prompts) * samples, PROMPT_LEN + new)
    return len(prompts) * samples * new / wall, len(prompts) * samples * new / cpu


def summarise(result: dict, key: str, rates: dict) -> None:
    med = {}
    for name, vals in rates.items():
        if vals:
            walls, cpus = [v[0] for v in vals], [v[1] for v in vals]
            result[f"{key}_{name}_tok_s_best"] = round(max(walls), 1)
            result[f"{key}_{name}_tok_s_median"] = med[name] = round(statistics.median(walls), 1)
            # tokens per CPU-second of this process: less skewed than wall time on a shared host
            med[name + "_cpu"] = round(statistics.median(cpus), 1)
            result[f"{key}_{name}_tok_per_cpu_s_median"] = med[name + "_cpu"]
    if rates["transformers"]:
        result[f"{key}_speedup_median"] = round(med["align"] / med["transformers"], 2)
        result[f"{key}_speedup_cpu_median"] = round(med["align_cpu"] / med["transformers_cpu"], 2)


def parse_variant(variant: str) -> tuple[torch.dtype, str, str]:
    """`dtype[:linear[:cpu_kernels]]` -> (torch dtype, EngineConfig.linear_kernel, .cpu_kernels); a kernel left
    out or empty is "auto", the default."""
    dtype_name, linear, cpu_kernels = (variant.split(":") + ["", ""])[:3]
    if (dtype_name not in DTYPES or linear not in ("", *LINEAR_KERNELS) or cpu_kernels not in ("", *CPU_KERNELS)
            or variant.count(":") > 2):
        raise ValueError(f"{variant!r} is not dtype[:linear[:cpu_kernels]] with dtype one of {', '.join(DTYPES)}, "
                         f"linear one of {', '.join(LINEAR_KERNELS)}, cpu_kernels one of {', '.join(CPU_KERNELS)}")
    return DTYPES[dtype_name], linear or "auto", cpu_kernels or "auto"


def bench_variant(result: dict, shape: str, variant: str, args) -> None:
    dtype, linear, cpu_kernels = parse_variant(variant)
    torch.manual_seed(0)
    model = MistralForCausalLM(SHAPES[shape]).eval()
    twin = None if args.no_hf else build_hf(model)
    model = model.to(dtype)
    if twin is not None:
        twin = twin.eval().to(dtype)
    for load in args.loads.split(","):
        n_prompts, samples, new, temp = LOADS[load]
        g = torch.Generator().manual_seed(1)
        prompts = torch.randint(3, model.config.vocab_size, (n_prompts, PROMPT_LEN), generator=g).tolist()
        client = make_client(model, new, not args.no_batch_invariant, linear, cpu_kernels)
        result[f"{shape}_{variant.replace(':', '_')}_kernel"] = client.engine.linear_kernel
        result[f"{shape}_{variant.replace(':', '_')}_cpu_kernels"] = client.engine.cpu_kernels
        run_align(client, prompts[:1], 1, 4, temp)  # warm-up: thread pools, allocator
        if twin is not None:
            run_hf(twin, prompts[:1], 1, 4, temp)
        rates: dict[str, list[tuple[float, float]]] = {"align": [], "transformers": []}
        for _ in range(args.repeats):
            rates["align"].append(run_align(client, prompts, samples, new, temp))
            if twin is not None:
                rates["transformers"].append(run_hf(twin, prompts, samples, new, temp))
        summarise(result, f"{shape}_{load}_{variant.replace(':', '_')}", rates)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="tiny,small")
    ap.add_argument("--loads", default="b1,b16,grpo")
    ap.add_argument("--variants", default="float32,float32:torch,bfloat16,bfloat16:torch",
                    help="dtype[:linear[:cpu_kernels]]: linear = auto (default), torch or onednn; cpu_kernels = "
                         "auto (default), torch or native")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-hf", action="store_true", help="skip transformers even when installed")
    ap.add_argument("--no-batch-invariant", action="store_true", help="EngineConfig.batch_invariant=False")
    args = ap.parse_args()
    for variant in args.variants.split(","):  # refuse a misspelt variant before minutes of timing, not after
        try:
            parse_variant(variant)
        except ValueError as exc:
            ap.error(f"--variants: {exc}")
    torch.set_num_threads(args.threads)
    result = {"bench": "generate", "what": "generated tokens/s (wall, prefill included)",
              "prompt_len": PROMPT_LEN, "threads": args.threads, "repeats": args.repeats,
              "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"),
              "batch_invariant": not args.no_batch_invariant, "load_avg_1m_start": round(os.getloadavg()[0], 2),
              "malloc": {k: os.environ[k] for k in ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_") if k in os.environ}
              or "glibc default", "torch": torch.__version__, "python": platform.python_version()}
    for shape in args.shapes.split(","):
        for variant in args.variants.split(","):
            bench_variant(result, shape, variant, args)
    result["load_avg_1m_end"] = round(os.getloadavg()[0], 2)  # other work on the host skews both sides
    print(json.dumps(result))


if __name__ == "__main__":
    main()
