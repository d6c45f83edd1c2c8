"""The `code_tests` reward's cost: sandboxed runs per second (align.sandbox.code_tests.code_reward: namespaces,
rlimits, uid drop, audit hook, the preloaded modules) beside the bare reference, the same program and tests in a
plain `python -I -S -B -c` child with no isolation (subprocess.run, the same interpreter flags, no limits), one at a time and with `--workers` threads.
The difference is what the isolation costs per sample. Prints one JSON line.

    .venv/bin/python bench/sandbox_runs.py --runs 64 --workers 2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from align.sandbox.code_tests import code_reward  # noqa: E402
from align.sandbox.run import run_python  # noqa: E402

PROGRAM = "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n"
TESTS = "assert fib(10) == 55\nassert fib(20) == 6765\nassert fib(1) == 1\nassert fib(0) == 0"
COMPLETION = f"Here it is:\n```python\n{PROGRAM}```\n"


def bare(_: int) -> float:
    src = PROGRAM + "\n" + TESTS
    return float(subprocess.run([sys.executable, "-I", "-S", "-B", "-c", src], capture_output=True,
                                timeout=30).returncode == 0)


def sandboxed(_: int) -> float:
    return code_reward(COMPLETION, TESTS).reward


def rate(fn, runs: int, workers: int) -> tuple[float, float]:
    start = time.perf_counter()
    if workers == 1:
        rewards = [fn(i) for i in range(runs)]
    else:
        with ThreadPoolExecutor(workers) as pool:
            rewards = list(pool.map(fn, range(runs)))
    seconds = time.perf_counter() - start
    assert all(r == 1.0 for r in rewards), rewards
    return runs / seconds, 1000 * seconds / runs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    layers = run_python([("program", "pass")]).layers
    out = {"bench": "sandbox_runs", "runs": args.runs, "workers": args.workers, "layers": layers}
    for name, fn in (("bare", bare), ("sandbox", sandboxed)):
        for workers in (1, args.workers):
            per_s, ms = rate(fn, args.runs, workers)
            out[f"{name}_w{workers}_runs_per_s"] = round(per_s, 2)
            out[f"{name}_w{workers}_ms_per_run"] = round(ms, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
