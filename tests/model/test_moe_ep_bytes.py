"""bench/moe_ep_bytes.py keeps working and its balanced-routing count is exact: 2 gloo ranks, rigged routing (k/ep
experts on every EP rank), counted all-to-all bytes == 4 passes x tokens x k x d x bytes x (ep-1)/ep; the printed
table is seed 000's (1.50 / 27.0 GiB at 1,024 tokens, crossover 18,432)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.distributed
ROOT = Path(__file__).resolve().parents[2]


def test_balanced_routing_count_is_exact():
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "moe_ep_bytes.py"), "--world", "2", "--tokens", "12",
                           "--cases", "balanced"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    got = line["counted"]["balanced"]
    assert got["exact"] and got["counted_bytes_per_rank"] == [4 * 12 * 4 * 64 * 4 // 2] * 2, got
    assert got["count_message_bytes_per_rank"] == 2 * (2 + 8) * 8 // 2  # [ep, 2 + E/ep] int64, half off-rank
    assert line["table"]["rows"][0] == {"tokens_per_rank": 1024, "ep_gib": 1.5, "fsdp_experts_gib": 27.0,
                                        "fsdp_over_ep": 18.0}
    assert line["table"]["crossover_tokens_per_rank"] == 18432
