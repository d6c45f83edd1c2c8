"""Seconds per GRPO step: align (native Engine sampler with paged KV and prefix sharing, GrpoTrainModule with the
chunked tempered head) beside TRL's GRPOTrainer (transformers `generate`), same shape, same reward, same machine.

One step = one rollout of 4 prompts x 4 samples with 64 new tokens at temperature 1, rewards from align's verifier
(both sides), advantages, and one optimizer step (AdamW). Shape (the DPO/SFT benches' tiny shape): Mistral vocab
32768, hidden 256, 4 layers, 8/2 heads, ffn 768, fp32, random weights (so every completion runs to 64 tokens on both
sides). Prompts are the bundled task's RL prompts. align is timed twice: `old_logprobs = "rollout"` (trusts the
sampler's log-probs, as TRL does with one iteration per generation), "recompute" (the stage default: pi_old from
the training forward itself, exact train/infer correction), and "recompute" with a bf16 copy of the weights in the
sampler (rho then corrects a real mismatch), and that with the training head's GEMMs in bf16 too (`loss.head_dtype`;
softmax and accumulation stay fp32). Each side runs in its own process. Prints ONE JSON line with the median
wall and CPU seconds per step (CPU seconds: all threads of the process, robust on a busy host), the generation
share, and the speedups over TRL.

    python bench/grpo_step.py [--steps 4] [--warmup 1] [--threads 2] [--side both|align|trl]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

P, G, NEW = 4, 4, 64
SHAPE = dict(vocab_size=32768, hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=2)


def questions(n: int) -> tuple[list[str], list[str]]:
    import pyarrow.parquet as pq

    table = pq.read_table(ROOT / "data" / "raw" / "math_rl.parquet").slice(0, n).to_pylist()
    return [r["prompt"] for r in table], [r["answer"] for r in table]


def summary(steps: list[float], cpu: list[float], gen: list[float], tokens: list[int]) -> dict:
    """Median wall seconds per step, CPU seconds per step (all threads of the process: robust to a busy host),
    generation seconds and share of the step."""
    med = statistics.median(steps)
    return {"step_s": round(med, 3), "cpu_s": round(statistics.median(cpu), 3),
            "gen_s": round(statistics.median(gen), 3), "gen_share": round(statistics.median(gen) / med, 3),
            "new_tokens_per_step": int(statistics.median(tokens)), "steps_s": [round(s, 3) for s in steps]}


def run_align(args, old_logprobs: str, engine_dtype: str = "float32", head_dtype: str = "float32") -> dict:
    import torch

    from align.eval.verifier import score
    from align.model import MistralConfig, MistralForCausalLM
    from align.rl.advantages import AdvantageConfig
    from align.rl.batch_source import GrpoBatchSource, PromptSet
    from align.rl.curriculum import CurriculumConfig, PromptCurriculum
    from align.rl.grpo_loss import GrpoLossConfig
    from align.rl.grpo_module import GrpoTrainModule
    from align.rl.rewards import CompositeReward, RewardConfig
    from align.rl.stage_config import DynamicSamplingConfig, RolloutShape
    from align.rollout import RolloutConfig, make_rollout_client
    from align.tokenizer import Tokenizer
    from align.train.optim import OptimizerConfig
    from align.train.train_module import AccumInfo, TrainModuleConfig

    torch.set_num_threads(args.threads)
    tok = Tokenizer.from_pretrained()
    qs, golds = questions(P * (args.steps + args.warmup))
    ids = [tuple(tok.encode_prompt([{"role": "user", "content": q}])) for q in qs]
    prompts = PromptSet(ids=lambda r: ids[r], gold=lambda r: golds[r], groups=["1"] * len(ids))
    torch.manual_seed(0)
    cfg = MistralConfig(**SHAPE, max_position_embeddings=256, pad_token_id=0)
    model, engine_model = MistralForCausalLM(cfg), MistralForCausalLM(cfg)
    engine_model.load_state_dict(model.state_dict())
    engine_model.to(getattr(torch, engine_dtype))
    client = make_rollout_client(RolloutConfig(), engine_model)
    module = GrpoTrainModule(model, TrainModuleConfig(optimizer=OptimizerConfig(lr=1e-6)),
                             GrpoLossConfig(head_dtype=head_dtype), 1.0, NEW, 100, client=client)
    shape = RolloutShape(prompts=P, samples=G, max_new_tokens=NEW, micro_batch_size=P * G, old_logprobs=old_logprobs)
    source = GrpoBatchSource(prompts, client, lambda x: tok.decode(x, skip_special_tokens=True),
                             CompositeReward(RewardConfig(), NEW, score),
                             PromptCurriculum(prompts.groups, CurriculumConfig(order="shuffle"), 0), shape,
                             DynamicSamplingConfig(enabled=False), AdvantageConfig(), seed=0, eos_id=tok.eos_id,
                             policy_version=lambda: module.version,
                             old_scorer=module.score if old_logprobs == "recompute" else None)
    it, steps, cpu, gen, tokens = iter(source), [], [], [], []
    for i in range(args.warmup + args.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        window = next(it)
        units = sum(module.loss_units(mb) for mb in window)
        for j, mb in enumerate(window):
            module.train_batch(mb, AccumInfo(j, len(window), units, 1))
        module.optim_step()
        module.zero_grads()
        if i >= args.warmup:
            steps.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            gen.append(window[0]["stats"]["rollout/gen_s"])
            tokens.append(int(window[0]["stats"]["rollout/gen_tokens"]))
    return summary(steps, cpu, gen, tokens)


def run_trl(args) -> dict:
    import torch
    from datasets import Dataset
    from transformers import MistralConfig, MistralForCausalLM, PreTrainedTokenizerFast
    from trl import GRPOConfig, GRPOTrainer

    from trl_clock import StepClock

    from align.eval.verifier import score

    torch.set_num_threads(args.threads)
    tok = PreTrainedTokenizerFast(tokenizer_file=str(ROOT / "assets/tokenizer/mistral-7b-v0.3/tokenizer.json"),
                                  bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<unk>")
    qs, golds = questions(P * (args.steps + args.warmup))
    data = Dataset.from_dict({"prompt": [f"[INST] {q} [/INST]" for q in qs], "answer": golds})
    torch.manual_seed(0)
    model = MistralForCausalLM(MistralConfig(**SHAPE, head_dim=32, max_position_embeddings=256, bos_token_id=1,
                                             eos_token_id=2, pad_token_id=0, tie_word_embeddings=False))
    gen_times: list[float] = []
    raw_generate = model.generate

    def timed_generate(*a, **k):
        t0 = time.perf_counter()
        out = raw_generate(*a, **k)
        gen_times.append(time.perf_counter() - t0)
        return out

    model.generate = timed_generate

    def reward(completions, answer, **_):
        return [float(score(c, a).reward or 0.0) for c, a in zip(completions, answer)]

    clock = StepClock()
    with tempfile.TemporaryDirectory() as out:
        cfg = GRPOConfig(output_dir=out, per_device_train_batch_size=P * G, num_generations=G,
                         max_completion_length=NEW, learning_rate=1e-6, max_steps=args.warmup + args.steps,
                         logging_steps=1, report_to=[], use_cpu=True, save_strategy="no", beta=0.0,
                         temperature=1.0, gradient_accumulation_steps=1, seed=0, disable_tqdm=True,
                         dataloader_num_workers=0, shuffle_dataset=False)
        trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=cfg, train_dataset=data,
                              processing_class=tok, callbacks=[clock])
        trainer.train()
        lengths = [h.get("completions/mean_length") for h in trainer.state.log_history]
    w = args.warmup
    return summary(clock.wall[w:], clock.cpu[w:], gen_times[w:], [int((x or 0) * P * G) for x in lengths[w:]])


def child(args) -> None:
    result = run_trl(args) if args.side == "trl" else run_align(args, *args.side.split(":")[1:])
    print(json.dumps(result))


def spawn(args, side: str) -> dict:
    cmd = [sys.executable, __file__, "--child", "--side", side, "--steps", str(args.steps), "--warmup",
           str(args.warmup), "--threads", str(args.threads)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--side", default="both")
    ap.add_argument("--child", action="store_true")
    args = ap.parse_args()
    if args.child:
        return child(args)
    result = {"bench": "grpo_step", "prompts": P, "samples": G, "new_tokens": NEW, "shape": SHAPE,
              "threads": args.threads, "allocator": os.environ.get("MALLOC_MMAP_MAX_", "glibc default")}
    if args.side in ("both", "align"):
        result["align"] = spawn(args, "align:rollout")
        result["align_recompute"] = spawn(args, "align:recompute")
        result["align_bf16_sampler"] = spawn(args, "align:recompute:bfloat16")
        result["align_bf16"] = spawn(args, "align:recompute:bfloat16:bfloat16")
    if args.side in ("both", "trl"):
        try:
            import trl  # noqa: F401

            result["trl"] = spawn(args, "trl")
        except ImportError:
            result["trl"] = "not installed (oracle extra)"
    if isinstance(result.get("trl"), dict) and "step_s" in result["trl"] and "step_s" in result.get("align", {}):
        for key in ("align", "align_recompute", "align_bf16_sampler", "align_bf16"):
            if "step_s" in result.get(key, {}):
                result[f"speedup_{key}"] = round(result["trl"]["step_s"] / result[key]["step_s"], 2)
                result[f"cpu_speedup_{key}"] = round(result["trl"]["cpu_s"] / result[key]["cpu_s"], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
