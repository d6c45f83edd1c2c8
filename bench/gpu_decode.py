"""Engine decode tokens/s beside transformers `generate`: same weights, same prompts, greedy, same process; ONE
JSON line. What scripts/gpu_check.sh times on a GPU (the 1b shape of bench/gpu_sft_step.py in bf16):

    python bench/gpu_decode.py                                   # CUDA, 1b, 16 prompts x 64 tokens, 128 new
    python bench/gpu_decode.py --device cpu --shape tiny --dtype float32 --prompts 2 --new 8    # the CPU dry run

tokens/s = generated tokens / wall seconds of the whole call (prefill included), best of `--repeats` after one
warm-up call. Both sides produce exactly `new` tokens per prompt (no stop tokens; transformers with
min_new_tokens = max_new_tokens). The engine's prefix cache is dropped before every call. The greedy tokens of the
two are compared and the share of equal ones printed (bf16 ties may flip a token, after which the rest differ)."""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from gpu_sft_step import DTYPES, SHAPES, build_align, build_hf, sync

from align.inference import Engine, EngineConfig, GenerationRequest, SamplingParams


def run_engine(engine: Engine, prompts: list[list[int]], new: int) -> tuple[float, list[list[int]]]:
    engine.block_manager.reset_prefix_cache()
    params = SamplingParams(temperature=0.0, max_new_tokens=new)
    t0 = time.perf_counter()
    results = engine.generate([GenerationRequest(p, params) for p in prompts])
    sec = time.perf_counter() - t0
    out = [list(r.token_ids) for r in results]
    assert all(len(o) == new for o in out), [len(o) for o in out]
    return sec, out


@torch.inference_mode()
def run_hf(twin, prompts: list[list[int]], new: int, dev: torch.device) -> tuple[float, list[list[int]]]:
    ids = torch.tensor(prompts, device=dev)
    sync(dev)
    t0 = time.perf_counter()
    out = twin.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                        do_sample=False, pad_token_id=0)
    sync(dev)
    sec = time.perf_counter() - t0
    return sec, out[:, ids.shape[1]:].tolist()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="1b", choices=list(SHAPES))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=list(DTYPES))
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    dev, dtype, cfg = torch.device(args.device), DTYPES[args.dtype], SHAPES[args.shape]
    model = build_align(cfg, dev, dtype).eval()
    twin = build_hf(model, dev, dtype).eval()
    g = torch.Generator().manual_seed(2)
    prompts = torch.randint(3, cfg.vocab_size, (args.prompts, args.prompt_len), generator=g).tolist()
    engine = Engine(model, EngineConfig(max_model_len=args.prompt_len + args.new + 1, max_num_seqs=args.prompts))
    generated = args.prompts * args.new
    run_engine(engine, prompts[:1], 4)
    run_hf(twin, prompts[:1], 4, dev)
    eng_s, hf_s, eng_out, hf_out = [], [], None, None
    for _ in range(args.repeats):
        sec, eng_out = run_engine(engine, prompts, args.new)
        eng_s.append(sec)
        sec, hf_out = run_hf(twin, prompts, args.new, dev)
        hf_s.append(sec)
    same = sum(a == b for x, y in zip(eng_out, hf_out) for a, b in zip(x, y)) / generated
    result = {"bench": "gpu_decode", "shape": args.shape, "dtype": args.dtype, "prompts": args.prompts,
              "prompt_len": args.prompt_len, "new_tokens": args.new, "repeats": args.repeats,
              "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
              "engine_tokens_per_s": round(generated / min(eng_s), 1),
              "transformers_tokens_per_s": round(generated / min(hf_s), 1),
              "speedup": round(min(hf_s) / min(eng_s), 2), "greedy_token_agreement": round(same, 4),
              "torch": torch.__version__}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
