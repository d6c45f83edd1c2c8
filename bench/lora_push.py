"""CPU seconds of one GRPO weight push with `[lora]` (align.ppo.lora_stage.MergedWeightsClient) beside the same push
of a plain policy: what merging the adapters into every push costs. Prints ONE JSON line.

Shape: the tiny profile's policy (Mistral vocab 32768, hidden 128, 4 layers, 4/2 heads, ffn 512, tied embeddings,
fp32) or `--hidden/--layers/--ffn`; LoRA rank `--rank` (alpha 2 x rank) on q/k/v/o/gate/up/down with nonzero B.
The sampler is align's NativeRolloutClient (the Engine on a plain copy, as the GRPO stage builds it). Medians of
`--repeats` pushes after one warm-up push (the engine's first load packs its kernels' panels), CPU time of this
process (time.process_time), on `--threads` torch threads.

    python bench/lora_push.py [--repeats 21] [--threads 1] [--rank 8] [--hidden 128] [--layers 4] [--ffn 512]
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
    args = ap.parse_args()

    import torch

    from align.model import MistralConfig, MistralForCausalLM
    from align.ppo.lora import LoraConfig, apply_lora, lora_layers, merge_state_dict
    from align.ppo.lora_stage import MergedWeightsClient
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
    inner = NativeRolloutClient(MistralForCausalLM(cfg, init=False).eval().requires_grad_(False))
    merging = MergedWeightsClient(inner, lora)
    plain_weights = {n: p.detach() for n, p in plain.named_parameters()}
    lora_weights = {n: p.detach() for n, p in policy.named_parameters()}  # what GrpoTrainModule.push_weights sends

    plain_push = _cpu(lambda: inner.update_weights(plain_weights), args.repeats)
    lora_push = _cpu(lambda: merging.update_weights(lora_weights), args.repeats)
    merge_only = _cpu(lambda: merge_state_dict(lora_weights, lora.scaling), args.repeats)
    wrapped = sum(layer.weight.numel() for layer in lora_layers(policy).values())
    print(json.dumps({"bench": "lora_push", "hidden": args.hidden, "layers": args.layers, "ffn": args.ffn,
                      "rank": args.rank, "threads": args.threads, "params": sum(p.numel() for p in plain.parameters()),
                      "wrapped_weight_elements": wrapped, "plain_push_cpu_s": round(plain_push, 5),
                      "lora_push_cpu_s": round(lora_push, 5), "merge_cpu_s": round(merge_only, 5),
                      "lora_over_plain": round(lora_push / plain_push, 3) if plain_push else None}))


if __name__ == "__main__":
    main()
