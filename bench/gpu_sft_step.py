"""One SFT optimizer step of a Mistral model, tokens/s and MFU: align with its torch kernels, align with its Triton
kernels (RMSNorm, RoPE, SwiGLU, the fused CE head's rows: align.kernels.select "triton"), and plain transformers
(`MistralForCausalLM(labels=...)`, sdpa attention, full logits) with the same torch AdamW, same weights, same batch,
same process. Prints ONE JSON line.

    python bench/gpu_sft_step.py                        # 1b shape, bf16, CUDA (the step scripts/gpu_check.sh times)
    TRITON_INTERPRET=1 python bench/gpu_sft_step.py --device cpu --shape tiny --dtype float32 --steps 1 --warmup 1

Shapes: "1b" = vocab 32768, hidden 2048, ffn 5632, 22 layers, 16/4 heads (1.1 B parameters, TinyLlama-like);
"tiny" = the embedded tiny profile's shape with a small vocabulary (the CPU dry run). Step = forward + backward +
AdamW(fused) + zero_grad on one micro-batch of batch x seq tokens, all of them labelled; the align arms use the SFT
loss (align.train.sft_loss: fused chunked head, summed CE divided by the token count), transformers its mean CE.
MFU = 6 * parameters * tokens/s / peak (attention's T^2 FLOPs ignored, as align.train.callbacks.SpeedMonitor);
peak defaults to 989e12 (H100 SXM dense bf16) on CUDA, none on a CPU. The step-0 loss of every arm is printed: the
same weights and batch must give the same loss to bf16 rounding, or the arms did not compute the same thing."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

import torch

from align.kernels import select
from align.model import MistralConfig, MistralForCausalLM
from align.model.layers import set_kernels
from align.train.sft_loss import SftLossConfig, sft_loss

SHAPES = {
    "1b": MistralConfig(vocab_size=32768, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                        num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=4096),
    "tiny": MistralConfig(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256),
}
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def build_align(cfg: MistralConfig, dev: torch.device, dtype: torch.dtype) -> MistralForCausalLM:
    torch.manual_seed(0)
    with torch.device(dev):
        model = MistralForCausalLM(cfg)
    model.init_weights()
    return model.to(dtype).train()


def build_hf(model: MistralForCausalLM, dev: torch.device, dtype: torch.dtype):
    import transformers  # noqa: PLC0415 (the reference side of a benchmark, never a runtime need)

    fields = {k: v for k, v in dataclasses.asdict(model.config).items() if k != "rope_theta"}
    cfg = transformers.MistralConfig(**fields, rope_parameters={"rope_type": "default",
                                                                "rope_theta": model.config.rope_theta})
    cfg._attn_implementation = "sdpa"
    with torch.device(dev):
        twin = transformers.MistralForCausalLM(cfg).to(dtype)
    twin.load_state_dict(model.state_dict())
    return twin.train()


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def time_arm(step, dev: torch.device, warmup: int, steps: int) -> tuple[float, float]:
    """(step-0 loss, seconds per step over `steps` after `warmup` untimed ones)."""
    first = float(step())
    for _ in range(warmup - 1):
        step()
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync(dev)
    return first, (time.perf_counter() - t0) / steps


def align_step(model, batch: dict, kernel: str):
    set_kernels(model, kernel)
    cfg = SftLossConfig(kernel=kernel, chunk_size=4096)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    tokens = float((batch["labels"][:, 1:] != -100).sum())

    def step():
        out = sft_loss(model, batch, cfg)
        (out.loss / tokens).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return out.loss.detach() / tokens
    return step, opt


def hf_step(twin, batch: dict):
    opt = torch.optim.AdamW(twin.parameters(), lr=1e-5, fused=True)

    def step():
        loss = twin(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"]).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()
    return step, opt


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="1b", choices=list(SHAPES))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=list(DTYPES))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--arms", default="align_torch,align_triton,transformers")
    ap.add_argument("--peak-flops", type=float, default=None, help="default: 989e12 on CUDA, none on a CPU")
    args = ap.parse_args()
    dev, dtype, cfg = torch.device(args.device), DTYPES[args.dtype], SHAPES[args.shape]
    peak = args.peak_flops or (989e12 if dev.type == "cuda" else None)
    model = build_align(cfg, dev, dtype)
    n_params = sum(p.numel() for p in model.parameters())
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, cfg.vocab_size, (args.batch, args.seq), generator=g).to(dev)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids, dtype=torch.bool), "labels": ids.clone()}
    tokens = args.batch * args.seq
    result = {"bench": "gpu_sft_step", "shape": args.shape, "params": n_params, "dtype": args.dtype,
              "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "batch": args.batch,
              "seq": args.seq, "tokens_per_step": tokens, "warmup": args.warmup, "steps": args.steps,
              "peak_flops": peak, "torch": torch.__version__, "arms": {}}
    state = {k: v.clone() for k, v in model.state_dict().items()}  # every arm starts from the same weights
    for arm in args.arms.split(","):
        model.load_state_dict(state)
        try:
            if arm == "transformers":
                twin = build_hf(model, dev, dtype)
                step, opt = hf_step(twin, batch)
            elif arm in ("align_torch", "align_triton"):
                kernel = arm.removeprefix("align_")
                step, opt = align_step(model, batch, kernel)
                twin = None
            else:
                raise ValueError(f"unknown arm {arm!r}")
            loss0, sec = time_arm(step, dev, args.warmup, args.steps)
        except (RuntimeError, ValueError, ImportError, select.KernelGateError) as exc:
            result["arms"][arm] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        rate = tokens / sec
        result["arms"][arm] = {"loss_step0": round(loss0, 5), "s_per_step": round(sec, 4),
                               "tokens_per_s": round(rate, 1),
                               "mfu": round(6.0 * n_params * rate / peak, 4) if peak else None}
        if dev.type == "cuda":
            result["arms"][arm]["peak_mem_gib"] = round(torch.cuda.max_memory_allocated(dev) / 2**30, 2)
            torch.cuda.reset_peak_memory_stats(dev)
        del step, opt, twin
        model.zero_grad(set_to_none=True)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    print(json.dumps(result))
    return 0 if all("error" not in a for a in result["arms"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
