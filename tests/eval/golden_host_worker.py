"""Greedy decode of a checkpoint through the Engine as the golden pass runs it, printed as one JSON line: the
ISA-independence test runs this under the host's ISA and under an AVX2 emulation and compares the tokens."""

import json
import sys

import torch

from align.inference.config import EngineConfig, SamplingParams
from align.inference.engine import Engine
from align.inference.sequence import GenerationRequest
from align.model.checkpoint import load_checkpoint


def main(ckpt: str) -> None:
    torch.set_num_threads(1)
    model = load_checkpoint(ckpt, dtype=torch.float32)
    engine = Engine(model, EngineConfig())
    prompts = [[1, *range(100 + 7 * i, 100 + 7 * i + 5 + i)] for i in range(8)]
    params = SamplingParams(temperature=0.0, max_new_tokens=24)
    out = engine.generate([GenerationRequest(p, params) for p in prompts])
    print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(),
                      "kernels": [engine.linear_kernel, engine.cpu_kernels],
                      "tokens": [list(o.token_ids) for o in out]}))


if __name__ == "__main__":
    main(sys.argv[1])
