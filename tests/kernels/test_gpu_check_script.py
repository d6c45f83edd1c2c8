"""scripts/gpu_check.sh proven as far as a CPU allows: its --dry-run runs every step (gpu-marked tests collected,
the Triton gates under the interpreter, the SFT-step and decode benchmarks on tiny shapes) and folds them into one
JSON and a table; without CUDA a real run refuses with exit 3 before doing anything."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="the triton extra is not installed (the gates need it)")


def _run(*args: str, tmp: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "ALIGN_VENV": sys.prefix}
    env.pop("TRITON_INTERPRET", None)  # the script sets what a dry run needs itself
    return subprocess.run(["bash", str(SCRIPT), "--no-install", "--out", str(tmp), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)


@pytest.mark.slow  # ~50 s of subprocesses loading torch, transformers and the Triton interpreter: the slow tier
@needs_triton
def test_dry_run_runs_every_step_and_writes_one_report(tmp_path):
    proc = _run("--dry-run", tmp=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rep = json.loads((tmp_path / "gpu_check.json").read_text())
    assert [s["step"] for s in rep["steps"]] == ["gpu_tests", "gates", "sft_step", "decode"]
    assert rep["ok"] and all(s["rc"] == 0 for s in rep["steps"])
    assert "collected" in rep["gpu_tests"] and not rep["gpu_tests"].startswith("0/")
    assert sorted(g["name"] for g in rep["gates"]) == sorted(
        ["fused_ce", "seq_logprob", "rms_norm", "rope", "swiglu", "moe_permute"])
    assert all(g["passed"] and g["kind"] == "interpret" for g in rep["gates"])
    assert (tmp_path / "gates" / "rope.interpret.json").exists()  # the records the "triton" arm was checked against
    arms = rep["sft_step"]["arms"]
    assert set(arms) == {"align_torch", "align_triton", "transformers"}
    assert all("error" not in a and a["tokens_per_s"] > 0 for a in arms.values()), arms
    losses = [a["loss_step0"] for a in arms.values()]  # same weights, same batch: the same loss (fp32)
    assert max(losses) - min(losses) < 1e-4, arms
    dec = rep["decode"]
    assert dec["engine_tokens_per_s"] > 0 and dec["transformers_tokens_per_s"] > 0
    assert dec["greedy_token_agreement"] == 1.0  # fp32 greedy on both sides
    table = (tmp_path / "gpu_check.txt").read_text()
    assert "gate rope" in table and "align_triton" in table and table.strip().endswith("OK")


def test_a_real_run_without_cuda_refuses_with_exit_3(tmp_path):
    proc = _run(tmp=tmp_path)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "no CUDA device" in proc.stderr


def test_an_unknown_argument_is_exit_2(tmp_path):
    proc = _run("--fast", tmp=tmp_path)
    assert proc.returncode == 2 and "unknown argument --fast" in proc.stderr


def _collected(*paths: str) -> list[str]:
    proc = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "--collect-only", "-q", "-p",
                           "no:cacheprovider", *paths], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return sorted(line for line in proc.stdout.splitlines() if "::" in line)


@pytest.mark.slow
def test_the_gpu_step_runs_every_gpu_test_of_the_tree():
    """The script collects only the files that say pytest.mark.gpu (--list-gpu-tests); the whole tree's `-m gpu`
    collection finds no gpu test outside them, and the same node ids inside."""
    listed = subprocess.run(["bash", str(SCRIPT), "--list-gpu-tests"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.split()
    whole = _collected()
    assert whole and {node.split("::")[0] for node in whole} <= set(listed)
    assert _collected(*listed) == whole
