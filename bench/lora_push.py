"""CPU seconds of one GRPO weight push with `[lora]` beside the same push of a plain policy, for both ways a sampler
can follow a LoRA policy (align.lora.stage): "merged" (MergedWeightsClient: W + B A alpha/r merged into every
push of every wrapped weight, the engine holds a plain model) and "adapters" (AdapterWeightsClient: the engine holds
the base once and runs base(x) + (x A^T)(s B)^T, a push moves the adapter tensors only); and the decode step each
engine then runs. Prints ONE JSON line.

Shape: the tiny profile's policy (Mistral vocab 32768, hidden 128, 4 layers, 4/2 heads, ffn 512, tied embeddings,
fp32) or `--hidden/--layers/--ffn`; LoRA rank `--rank` (alpha 2 x rank) on q/k/v/o/gate/up/down with nonzero B.
The sampler is align's NativeRolloutClient (the Engine, as the GRPO stage builds it). Push: medians of `--repeats`
pushes after one warm-up push (the engine's first load packs its kernels' panels). Decode step: `--rows` greedy
requests of 16-token prompts decoding `--new-tokens` tokens in one batch, the median CPU time of an engine step
(prefill steps are a few of them; the median is a decode step's). CPU time of this process (time.process_time), on
`--threads` torch threads.

    python bench/lora_push.py [--repeats 21] [--threads 1] [--rank 8] [--hidden 128] [--layers 4] [--ffn 512]
                              [--rows 16] [--new-tokens 48]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _cpu(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=512)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=48)
    args = ap.parse_args()

    import torch

    from align.model import MistralConfig, MistralForCausalLM
    from align.lora.adapters import LoraConfig, apply_lora, lora_layers, merge_state_dict
    from align.lora.stage import AdapterWeightsClient, MergedWeightsClient
    from align.rollout.native import NativeRolloutClient

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = MistralConfig(vocab_size=32768, hidden_size=args.hidden, intermediate_size=args.ffn,
                        num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2,
                        max_position_embeddings=256, tie_word_embeddings=True, pad_token_id=0)
    plain = MistralForCausalLM(cfg)
    policy = MistralForCausalLM(cfg, init=False)
    policy.load_state_dict(plain.state_dict())
    lora = LoraConfig(rank=args.rank, alpha=2.0 * args.rank, target_modules=TARGETS)
    apply_lora(policy, lora)
    with torch.no_grad():
        for layer in lora_layers(policy).values():
            layer.lora_B.weight.normal_(0, 0.01)

    def sampler():
        model = MistralForCausalLM(cfg, init=False).eval().requires_grad_(False)
        model.load_state_dict(plain.state_dict())  # the start checkpoint the rollout engine is built from
        return NativeRolloutClient(model)

    inner = sampler()
    merging = MergedWeightsClient(sampler(), lora)
    adapters = AdapterWeightsClient(sampler(), lora)
    plain_weights = {n: p.detach() for n, p in plain.named_parameters()}
    lora_weights = {n: p.detach() for n, p in policy.named_parameters()}  # what GrpoTrainModule.push_weights sends

    plain_push = _cpu(lambda: inner.update_weights(plain_weights), args.repeats)
    merged_push = _cpu(lambda: merging.update_weights(lora_weights), args.repeats)
    merge_only = _cpu(lambda: merge_state_dict(lora_weights, lora.scaling), args.repeats)
    adapter_push = _cpu(lambda: adapters.update_weights(lora_weights), args.repeats)
    adapter_bytes = sum(p.numel() * p.element_size() for n, p in lora_weights.items() if ".lora_" in n)
    wrapped = sum(layer.weight.numel() for layer in lora_layers(policy).values())
    steps = {name: _decode_step_cpu(client.engine, args.rows, args.new_tokens, cfg.vocab_size)
             for name, client in (("plain", inner), ("merged", merging), ("adapters", adapters))}
    print(json.dumps({"bench": "lora_push", "hidden": args.hidden, "layers": args.layers, "ffn": args.ffn,
                      "rank": args.rank, "threads": args.threads, "params": sum(p.numel() for p in plain.parameters()),
                      "wrapped_weight_elements": wrapped, "kernel": inner.engine.linear_kernel,
                      "plain_push_cpu_s": round(plain_push, 5), "merged_push_cpu_s": round(merged_push, 5),
                      "merge_cpu_s": round(merge_only, 5), "adapter_push_cpu_s": round(adapter_push, 6),
                      "adapter_push_bytes": adapter_bytes,
                      "plain_push_bytes": sum(p.numel() * p.element_size() for p in plain_weights.values()),
                      "merged_over_plain": round(merged_push / plain_push, 3) if plain_push else None,
                      "adapter_over_plain": round(adapter_push / plain_push, 4) if plain_push else None,
                      "rows": args.rows, "decode_step_cpu_s": {k: round(v, 5) for k, v in steps.items()},
                      "adapter_step_over_plain": round(steps["adapters"] / steps["plain"], 3)}))


def _decode_step_cpu(engine, rows: int, new_tokens: int, vocab: int) -> float:
    """Median CPU seconds of an engine step while `rows` greedy requests decode together (after a warm-up run)."""
    import torch

    from align.inference import GenerationRequest, SamplingParams

    g = torch.Generator().manual_seed(1)
    reqs = [GenerationRequest(torch.randint(1, vocab, (16,), generator=g).tolist(),
                              SamplingParams(0.0, max_new_tokens=new_tokens)) for _ in range(rows)]
    engine.generate(reqs)  # warm-up: packs, the row-count probe, the allocator
    engine.sync_weights()
    for i, r in enumerate(reqs):
        engine.add_request(r, i)
    times = []
    while engine.scheduler.has_unfinished():
        t0 = time.process_time()
        engine.step()
        times.append(time.process_time() - t0)
    return statistics.median(times)

if __name__ == "__main__":
    main()
