"""What a stage's numbers depend on besides its inputs, code and config: recorded in every manifest a torch worker
writes (`fingerprint`) and pinned by the pipeline's launcher (`PINNED_ENV`).

Same key, same bytes: a content-addressed artifact must be a function of its key. On a CPU the bits of a float
result follow (a) the instruction set the kernels run (torch's CPU capability, the C kernels' -march), (b) the thread
count, which fixes how torch and MKL split a reduction, and (c) the library versions. (b) must not follow the
moment a stage runs: MKL_DYNAMIC (MKL's default: on) lets MKL run fewer threads than asked, and OMP_DYNAMIC lets
libgomp shrink a parallel region by the host's load average (gomp_dynamic_max_threads); both are pinned off. The
stages set their thread count from the config (`threads`, 0 = os.cpu_count(): the host's CPUs, not the affinity
mask or the load at start). Stdlib only; torch is read from sys.modules when the process imported it."""

from __future__ import annotations

import functools
import os
import platform
import sys

# Exported values win (as for the launcher's other settings); these are what a worker gets otherwise.
PINNED_ENV = {"MKL_DYNAMIC": "FALSE", "OMP_DYNAMIC": "FALSE"}
# The variables that change a CPU result's bits when set; quoted in the fingerprint as the worker saw them.
NUMERICS_ENV = ("MKL_DYNAMIC", "OMP_DYNAMIC", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "MKL_CBWR",
                "MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY", "DNNL_MAX_CPU_ISA", "ONEDNN_MAX_CPU_ISA",
                "ALIGN_NATIVE_MARCH")


@functools.cache  # the CPU does not change under a process; every manifest write asks
def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_fingerprint() -> dict:
    """The host side (no torch): CPU model, CPU count, the affinity mask's size and the numerics variables."""
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {"cpu": cpu_model(), "machine": platform.machine(), "cpu_count": os.cpu_count(), "affinity": affinity,
            "env": {key: os.environ[key] for key in NUMERICS_ENV if key in os.environ}}


def fingerprint() -> dict:
    """`host_fingerprint` plus, in a process that imported torch, its version, thread count and CPU capability."""
    found = host_fingerprint()
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_num_threads"):
        found["torch"] = {"version": str(torch.__version__), "threads": torch.get_num_threads(),
                          "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                          "mkl": bool(torch.backends.mkl.is_available())}
    return found
