"""Which implementation of a kernel name runs: "torch" (the reference), or "triton" (align/kernels/triton_*.py).

    "torch"   always the torch reference
    "auto"    Triton only on a CUDA device, only when Triton is installed and the kernel's equivalence gate passed
              there (align.kernels.gate); everything else (every CPU) runs exactly what it ran before Triton existed
    "triton"  Triton or a clear error: on a CPU it needs TRITON_INTERPRET=1 (the interpreter, tests), and on any
              device a passing gate record for this kernel, Triton, torch and GPU model

Kernel names: "fused_ce" (SFT's head rows), "seq_logprob" (the DPO log-prob head's rows), "rms_norm", "rope",
"swiglu", "moe_permute" (tokens to experts and back)."""

from __future__ import annotations

import sys

import torch

from align.kernels import gate, triton_rt

CHOICES = ("auto", "torch", "triton")
NAMES = ("fused_ce", "seq_logprob", "rms_norm", "rope", "swiglu", "moe_permute")
GATE_COMMAND = "python -m align.model.kernel_gates"


class KernelGateError(RuntimeError):
    """"triton" was asked for a kernel whose equivalence gate has not passed here."""


_told: set[tuple[str, str]] = set()


def resolve(name: str, kernel: str, dev: torch.device) -> str:
    """"torch" or "triton" for kernel `name` on tensors on `dev` (see the module docstring)."""
    if name not in NAMES:
        raise ValueError(f"unknown kernel name {name!r}; known: {NAMES}")
    if kernel not in CHOICES:
        raise ValueError(f"kernel for {name} must be one of {CHOICES}, got {kernel!r}")
    if kernel == "torch":
        return "torch"
    if kernel == "auto":
        if dev.type != "cuda" or not triton_rt.installed():
            return "torch"
        reason = gate.refusal(name, dev)
        if reason is not None and (name, reason) not in _told:  # say once why the GPU runs the torch path
            _told.add((name, reason))
            print(f"align: kernel {name}: torch ({reason})", file=sys.stderr)
        return "torch" if reason is not None else "triton"
    triton_rt.require(dev)
    reason = gate.refusal(name, dev)
    if reason is not None:
        raise KernelGateError(f"kernel {name!r} = 'triton' refused: {reason}; run `{GATE_COMMAND}` on this "
                              "machine first (it records a pass only when every case agrees with torch)")
    return "triton"
