"""Build a C kernel from align/kernels/csrc once per machine and load it with ctypes.

Why C and ctypes: a few CPU kernels (paged decode attention) cannot be written well in torch ops (each op is a
pass over memory, and SDPA cannot read a paged cache in place), Triton has no CPU backend, and a torch C++
extension needs torch's headers (~1 minute of compilation on 2 cores) and ninja. A self-contained C file compiles
in well under a second with the system's C compiler and is called on tensors' data pointers. The compiler is a
build-time tool, not a Python dependency: where there is none (or it fails), `load` raises `NativeUnavailable` with
the reason and the callers fall back to their torch path ("auto") or stop with that error (asked for explicitly).

The library is cached under $ALIGN_NATIVE_CACHE (default ~/.cache/align/native) by a digest of the source, the
flags, the compiler's version and the CPU's model and feature flags (`-march=native` code is only valid on the
CPU it was built for; a home directory can be shared between machines). It is compiled to a private temporary
name and published by rename, so concurrent processes (doit workers, ranks) never load a half-written file."""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any

CSRC = Path(__file__).with_name("csrc")
MARCH_ENV = "ALIGN_NATIVE_MARCH"  # e.g. x86-64-v3: build for a narrower ISA than this CPU's (tests, A/B timings)


def flags() -> tuple[str, ...]:
    # -mtune=generic: the kernels write a*b + c and rely on GCC contracting it into an FMA; which ones it contracts
    # follows the tuning target, so -march=native's own tuning (znver3 on an AMD EPYC) gave 1-ulp different fp32
    # attention from an x86-64-v3 build on the same CPU. With one tuning everywhere the bits depend on the ISA alone.
    return ("-O3", f"-march={os.environ.get(MARCH_ENV) or 'native'}", "-mtune=generic", "-std=gnu11", "-fPIC",
            "-shared", "-pthread")

I64, PTR, F32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float  # the kernels' argument types
Signatures = dict[str, tuple[list[Any], Any]]  # C function -> (argtypes, restype)

_loaded: dict[str, ctypes.CDLL] = {}
_failed: dict[str, str] = {}


class NativeUnavailable(RuntimeError):
    """The C kernel could not be built or loaded here; the message says why."""


def _cpu_fingerprint() -> str:
    lines = []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "flags", "Features", "CPU part")):
                    lines.append(line.strip())
                if len(lines) >= 3:
                    break
    except OSError:
        pass
    return platform.machine() + "\n" + "\n".join(lines)


def _compiler() -> str:
    cc = os.environ.get("CC", "cc")
    path = shutil.which(cc)
    if path is None:
        raise NativeUnavailable(f"no C compiler: {cc!r} is not on PATH (set CC to one)")
    return path


def _cache_dir() -> Path:
    root = os.environ.get("ALIGN_NATIVE_CACHE")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "align" / "native"


@lru_cache(maxsize=None)
def _toolchain(cc: str) -> str:
    """The compiler's version and the CPU's identity, once per process (not once per kernel)."""
    return subprocess.run([cc, "--version"], capture_output=True, text=True).stdout + _cpu_fingerprint()


def _build(name: str) -> Path:
    source = CSRC / f"{name}.c"
    cc = _compiler()
    sources = [f"{p.name}\n{p.read_text()}" for p in sorted(CSRC.iterdir()) if p.suffix in (".c", ".h")]
    build_flags = flags()
    digest = hashlib.sha256(  # every source and header: an edited simd.h rebuilds the kernels that include it
        "\0".join([*sources, " ".join(build_flags), _toolchain(cc)]).encode()).hexdigest()[:16]
    out_dir = _cache_dir()
    target = out_dir / f"{name}-{digest}.so"
    if target.exists():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}-", suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        done = subprocess.run([cc, *build_flags, "-o", tmp, str(source), "-lm"], capture_output=True, text=True)
        if done.returncode != 0:
            raise NativeUnavailable(f"{cc} failed to build {source} (exit {done.returncode}):\n{done.stderr[-2000:]}")
        os.replace(tmp, target)  # atomic: a concurrent builder publishes the same bytes under the same name
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def load(name: str, signatures: Signatures | None = None) -> ctypes.CDLL:
    """The compiled csrc/<name>.c of this process (built on first use; a failure is remembered and re-raised), its
    functions typed by `signatures` (ctypes passes untyped arguments as C ints)."""
    if name not in _loaded:
        if name in _failed:
            raise NativeUnavailable(_failed[name])
        try:
            _loaded[name] = ctypes.CDLL(str(_build(name)))
        except (NativeUnavailable, OSError) as err:
            _failed[name] = str(err)
            raise NativeUnavailable(str(err)) from err
    lib = _loaded[name]
    for fn, (argtypes, restype) in (signatures or {}).items():
        getattr(lib, fn).argtypes, getattr(lib, fn).restype = argtypes, restype
    return lib
