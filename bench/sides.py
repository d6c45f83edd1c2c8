"""Running one side of a side-by-side benchmark (align, or a reference library) in a fresh process: each side pays
its own imports and peak memory, and prints its result as the last JSON line of its stdout."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def run_side(script: str, side: str, flags: dict[str, object]) -> dict:
    """`python script --side side --flag value ...`; its last stdout line parsed as JSON; stderr's tail on failure."""
    cmd = [sys.executable, script, "--side", side]
    for flag, value in flags.items():
        cmd += [f"--{flag}", str(value)]
    env = {**os.environ, "TQDM_DISABLE": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{side} side failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
