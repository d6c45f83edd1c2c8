"""Run a worker script as W plain gloo processes with the env:// rendezvous variables (torchrun's launcher process
would cost seconds per test on this 2-core host)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(script: Path, world: int, *args: str, timeout: float = 240, gpus: bool = False) -> list[str]:
    """Start `world` ranks of `script args...`, wait for all, assert each exited 0; their stdouts in rank order.
    The GPUs are hidden unless `gpus` (an NCCL worker puts rank r on GPU LOCAL_RANK = r)."""
    base = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(world)}
    if not gpus:
        base["CUDA_VISIBLE_DEVICES"] = ""
    procs = [subprocess.Popen([sys.executable, str(script), *args], cwd=REPO, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env={**base, "RANK": str(r), "LOCAL_RANK": str(r)})
             for r in range(world)]
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for r, (p, (_out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {r} exited {p.returncode}:\n{err[-3000:]}"
    return [out for out, _ in outs]


def rank_results(source: str, tmp_path: Path, world: int, *args: str) -> list[dict]:
    """Write a worker's `source` under tmp_path, run it on `world` ranks, and return the JSON object each rank
    printed (the lines starting with "{"), checking that every rank reported once."""
    script = tmp_path / "worker.py"
    script.write_text(source)
    outs = run_ranks(script, world, *args)
    results = [json.loads(line) for out in outs for line in out.splitlines() if line.startswith("{")]
    assert sorted(r["rank"] for r in results) == list(range(world))
    return results
