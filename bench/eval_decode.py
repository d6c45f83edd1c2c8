"""Decode throughput of the eval harness's shape (the tiny profile's model: vocab 32768, d 128, 4 layers, 4/2 heads,
ffn 512, fp32, random weights) on 1 and on 2 torch threads, greedy and sampled, same machine, same run.

Why: the golden_eval configs decode on one thread. On a 2-core host shared with other jobs a 2-thread OpenMP pool
spin-waits on a descheduled peer at every parallel region; this bench shows the cost (run it on a quiet host and
on a busy one). Each setting runs in a fresh process (torch's thread pool is fixed once it has started).
Prints ONE JSON line: generated tokens/s per (threads, pass), plus the 1-minute load average before the runs.

    .venv/bin/python bench/eval_decode.py [--prompts 96 --new 32 --samples 4]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

CHILD = """
import json, sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
from align.inference import Engine, EngineConfig, GenerationRequest, SamplingParams
from align.model import MistralConfig, MistralForCausalLM
prompts, new, samples = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.manual_seed(0)
cfg = MistralConfig(vocab_size=32768, hidden_size=128, intermediate_size=512, num_hidden_layers=4,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
model = MistralForCausalLM(cfg).eval()
ids = [[1] + [100 + 7 * i + j for j in range(40)] for i in range(prompts)]
out = {}
for name, temp, n in (("greedy", 0.0, 1), ("sampled", 1.0, samples)):
    engine = Engine(model, EngineConfig(max_model_len=128, max_num_seqs=256, max_num_batched_tokens=4096))
    reqs = [GenerationRequest(p, SamplingParams(temperature=temp, max_new_tokens=new), seed=i * 97 + k)
            for i, p in enumerate(ids) for k in range(n)]
    t0 = time.perf_counter()
    res = engine.generate(reqs)
    out[name] = round(sum(len(r.token_ids) for r in res) / (time.perf_counter() - t0), 1)
print(json.dumps(out))
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompts", type=int, default=96)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--samples", type=int, default=4)
    ns = parser.parse_args()
    load = os.getloadavg()[0]
    result = {"bench": "eval_decode", "load_1min": round(load, 2), "cpus": os.cpu_count(),
              "prompts": ns.prompts, "new_tokens": ns.new, "samples": ns.samples,
              "allocator": os.environ.get("MALLOC_MMAP_MAX_", "default"),
              "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default")}
    for threads in (1, 2):
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", CHILD, str(threads), str(ns.prompts), str(ns.new),
                               str(ns.samples)], capture_output=True, text=True, check=True,
                              env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
        rates = json.loads(proc.stdout.strip().splitlines()[-1])
        result[f"threads{threads}_tokens_per_s"] = rates
        result[f"threads{threads}_wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
