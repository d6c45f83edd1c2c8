"""Triton as an optional dependency: whether it is installed, whether kernels run on this device, lazy `jit`.

Triton is the `triton` extra (pyproject.toml), never a runtime need: every caller has a torch path. Kernels launch on
a CUDA device, or on CPU tensors under Triton's interpreter (`TRITON_INTERPRET=1`, how tests/kernels prove them on a
machine without a GPU). NOTE: the interpreter computes bf16 arithmetic wrongly (upstream), so every kernel converts a
loaded value to fp32 right after `tl.load` and rounds only when it stores; that is also what the GPU code does.

Kernels are plain functions wrapped by `jit` at their first launch, and Triton itself is imported only then (the
kernel modules' `tl` is bound at that moment): Triton decides between the compiler and the interpreter from
`TRITON_INTERPRET` when a function is wrapped, its own library functions (tl.zeros, tl.sum, ...) when
triton.language is imported. So importing align never imports Triton, and a test that sets the variable before its
first launch gets the interpreter throughout."""

from __future__ import annotations

import os
import importlib.metadata
import importlib.util
from functools import lru_cache

import torch

INTERPRET_ENV = "TRITON_INTERPRET"


class TritonUnavailable(RuntimeError):
    """A Triton kernel was asked for where it cannot run; the message says why and what to do."""


def installed() -> bool:
    return importlib.util.find_spec("triton") is not None


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
    return importlib.metadata.version("triton") if installed() else "none"


@lru_cache(maxsize=None)
def _jit(fn, interpret: bool):
    # NOTE: the optional extra, imported at the first launch (see the module docstring), never at align's import
    import triton  # noqa: PLC0415
    import triton.language  # noqa: PLC0415
    from triton.runtime.interpreter import InterpretedFunction  # noqa: PLC0415

    if interpret and not isinstance(triton.language.zeros, InterpretedFunction):
        raise TritonUnavailable(f"{INTERPRET_ENV}=1 was set after triton.language had been imported (its own "
                                "functions are compiled ones): set it before anything imports Triton")
    fn.__globals__["tl"] = triton.language
    return triton.jit(fn)


def jit(fn):
    """`triton.jit(fn)` made at first use, once per mode (compiled or interpreted)."""
    return _jit(fn, interpreting())

