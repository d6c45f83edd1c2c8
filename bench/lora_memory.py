"""Peak RSS and seconds per optimizer step of SFT full fine-tuning vs LoRA (align.lora.adapters), beside peft's LoRA on
the transformers model of the same shape and weights when peft is installed. Prints ONE JSON line.

Shape: bench/sft_throughput.py's (Mistral vocab 32768, hidden 256, 4 layers, 8/2 heads, ffn 768, fp32); batch
`--batch` x `--seq` random tokens, next-token cross-entropy over full logits (the same loss in every mode, so the
modes differ only in what is trained), AdamW lr 1e-4 over the parameters that require grad. LoRA: rank 8, alpha 16
on q/k/v/o/gate/up/down. Each mode runs in its own process (ru_maxrss is per process: it includes building the
model). Median wall and CPU seconds per step after `--warmup` steps; wall figures move with the machine's load.

    python bench/lora_memory.py [--steps 6] [--warmup 2] [--threads 2] [--batch 4] [--seq 128]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

RANK, ALPHA = 8, 16.0
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MODES = ("full", "lora", "peft")


def _model(mode: str, seq: int):
    import torch

    from sft_throughput import SHAPE

    if mode == "peft":
        import peft

        from sft_throughput import _hf_model

        base = _hf_model()
        cfg = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=list(TARGETS), lora_dropout=0.0)
        model = peft.get_peft_model(base, cfg)
        return lambda ids: model(input_ids=ids).logits, model
    from align.model import MistralConfig, MistralForCausalLM
    from align.lora.adapters import LoraConfig, apply_lora

    torch.manual_seed(0)
    model = MistralForCausalLM(MistralConfig(**SHAPE, head_dim=SHAPE["hidden_size"] // SHAPE["num_attention_heads"],
                                             max_position_embeddings=seq, tie_word_embeddings=False))
    if mode == "lora":
        apply_lora(model, LoraConfig(rank=RANK, alpha=ALPHA, target_modules=TARGETS))
    return model, model


def _child(args) -> dict:
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)
    forward, model = _model(args.child, args.seq)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 32768, (args.batch, args.seq), generator=g)
    wall, cpu = [], []
    for step in range(args.warmup + args.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        logits = forward(ids)
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step >= args.warmup:
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    return {"trainable_params": sum(p.numel() for p in params),
            "total_params": sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()),
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "step_s_median": round(statistics.median(wall), 4), "step_cpu_s_median": round(statistics.median(cpu), 4),
            "final_loss": round(loss.item(), 4)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--child", choices=MODES)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(args)))
        return
    out = {"bench": "lora_memory", "batch": args.batch, "seq": args.seq, "threads": args.threads,
           "rank": RANK, "alpha": ALPHA}
    for mode in MODES:
        cmd = [sys.executable, __file__, "--child", mode] + [f"--{k}={getattr(args, k)}" for k in
                                                             ("steps", "warmup", "threads", "batch", "seq")]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            out[mode] = {"error": (run.stderr.strip().splitlines() or ["failed"])[-1]}
            continue
        out[mode] = json.loads(run.stdout.strip().splitlines()[-1])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
