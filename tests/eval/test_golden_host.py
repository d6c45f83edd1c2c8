"""Same checkpoint -> same golden decode on another ISA: the guarantee the golden anchors rest on across hosts.

Training is not host-independent (CPU BLAS kernels differ by ISA and vendor), but decoding a given checkpoint is: the
engine's native C kernels compute every output as one fixed-order FMA chain with the same bits at every vector width
(align/kernels/csrc/simd.h). The decode runs twice in subprocesses, once on this host's ISA and once with torch,
oneDNN and the native kernels held to AVX2 (the emulation issue 9 used), and the tokens must be identical. On a
host without AVX-512 both runs are AVX2 and the test shows only run-to-run determinism."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from align.kernels import native
from align.model import MistralConfig, MistralForCausalLM
from align.model.checkpoint import save_checkpoint

ROOT = Path(__file__).resolve().parents[2]
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", native.MARCH_ENV: "x86-64-v3"}


def _decode(ckpt: Path, env: dict) -> dict:
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("golden_host_worker.py")), str(ckpt)],
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env}, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.uname().machine != "x86_64", reason="x86-64 ISAs")
def test_a_checkpoint_decodes_to_the_same_tokens_under_avx2(tmp_path):
    try:
        native.load("linear")
    except native.NativeUnavailable as err:
        pytest.skip(f"no native kernels here ({err}); the oneDNN / torch fallback is not ISA-independent")
    torch.manual_seed(5)
    cfg = MistralConfig(vocab_size=32768, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0)
    model = MistralForCausalLM(cfg)
    with torch.no_grad():  # larger weights than the init's: confident, varied continuations, not one repeated token
        for p in model.parameters():
            p.mul_(4.0)
    save_checkpoint(model, tmp_path / "ckpt")
    here = _decode(tmp_path / "ckpt", {})
    narrow = _decode(tmp_path / "ckpt", {**AVX2, "ALIGN_NATIVE_CACHE": str(tmp_path / "avx2-cache")})
    assert narrow["capability"] == "AVX2" and here["kernels"] == narrow["kernels"] == ["native", "native"]
    assert len({t for seq in here["tokens"] for t in seq}) > 8  # the decode says something
    assert here["tokens"] == narrow["tokens"]
