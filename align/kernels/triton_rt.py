"""Triton as an optional dependency: whether it is installed, whether kernels run on this device, lazy `jit`.

Triton is the `triton` extra (pyproject.toml), never a runtime need: every caller has a torch path. Kernels launch on
a CUDA device, or on CPU tensors under Triton's interpreter (`TRITON_INTERPRET=1`, how tests/kernels prove them on a
machine without a GPU). NOTE: the interpreter computes bf16 arithmetic wrongly (upstream), so every kernel converts a
loaded value to fp32 right after `tl.load` and rounds only when it stores; that is also what the GPU code does.

Kernels are plain functions wrapped by `jit` on first launch, not decorated at import: `triton.jit` decides between
the compiler and the interpreter from `TRITON_INTERPRET` when it wraps, so a test that sets the variable after
align was imported still gets the interpreter, and importing align never imports more of Triton than its package."""

from __future__ import annotations

import os
from functools import lru_cache

import torch

try:  # the optional extra; everything here answers "unavailable" without it
    import triton
except ImportError:
    triton = None

INTERPRET_ENV = "TRITON_INTERPRET"


class TritonUnavailable(RuntimeError):
    """A Triton kernel was asked for where it cannot run; the message says why and what to do."""


def installed() -> bool:
    return triton is not None


def interpreting() -> bool:
    return os.environ.get(INTERPRET_ENV) == "1"


def device_kind(dev: torch.device) -> str:
    """Where a kernel for tensors on `dev` runs: "cuda", "interpret" (CPU under TRITON_INTERPRET=1) or "none"."""
    if dev.type == "cuda":
        return "cuda"
    return "interpret" if dev.type == "cpu" and interpreting() else "none"


def why_not(dev: torch.device) -> str | None:
    """Why a Triton kernel cannot run on `dev` (None: it can)."""
    if not installed():
        return "triton is not installed (pip install -e '.[triton]' 'torch==2.13.0')"
    if device_kind(dev) == "none":
        return (f"Triton kernels run on CUDA tensors, or on CPU tensors only under {INTERPRET_ENV}=1 "
                f"(the interpreter, for tests); the tensors are on {dev}")
    return None


def require(dev: torch.device) -> None:
    reason = why_not(dev)
    if reason is not None:
        raise TritonUnavailable(reason)


def version() -> str:
    return triton.__version__ if installed() else "none"


@lru_cache(maxsize=None)
def _jit(fn, interpret: bool):
    return triton.jit(fn)


def jit(fn):
    """`triton.jit(fn)` made at first use, once per mode (compiled or interpreted)."""
    return _jit(fn, interpreting())

