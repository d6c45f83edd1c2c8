"""The equivalence gate of an optional kernel: its outputs and gradients against the torch reference on a fixed set
of shapes and dtypes, with stated tolerances, recorded as a small JSON that the selector (align.kernels.select)
reads before it lets a kernel replace the reference.

A `GateSpec` (built where both implementations are visible: align/model/kernel_gates.py) names the kernel, its
cases per device kind, the tolerance per dtype and two functions from one case's inputs to a dict of tensors
(outputs and the gradients of a fixed random cotangent). `run_gate` evaluates every case, compares elementwise

    |candidate - reference| <= abs_of_max * max|reference| + rel * |reference|   (both finite where the reference is)

(`abs_of_max` scales with the output's largest reference value, so one tolerance fits a gradient of 1e-3 and a loss
sum of 1e4; outputs named `exact_outputs` must agree bit for bit)

and writes `<gate dir>/<name>.<kind>.json`: per case and output the worst excess over the bound, the verdict, the
tolerances, the Triton / torch versions, the device name and the sha256 of the kernel's source files. A record is
valid only while all of those still match this process (`refusal`), so an edited kernel, another Triton or another
GPU model must pass the gate again before "auto" picks it. The directory is $ALIGN_GATE_DIR (default
~/.cache/align/gates), written atomically (temp + rename)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import torch

from align.kernels import triton_rt

GATE_DIR_ENV = "ALIGN_GATE_DIR"
Outputs = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Tolerance:
    abs_of_max: float  # absolute slack as a fraction of the output's largest |reference| value
    rel: float  # slack relative to each element's |reference|


@dataclass(frozen=True)
class GateCase:
    label: str  # e.g. "rows=4096 dim=4096"
    dtype: torch.dtype
    dims: dict[str, int]


@dataclass(frozen=True)
class GateSpec:
    name: str
    cases: dict[str, tuple[GateCase, ...]]  # device kind ("cuda" | "interpret") -> cases
    tolerance: dict[torch.dtype, Tolerance]
    make_inputs: Callable[[GateCase, torch.device, torch.Generator], dict]
    reference: Callable[[dict], Outputs]
    candidate: Callable[[dict], Outputs]
    sources: tuple[str, ...]  # the kernel's files (repository-relative to align/..): their hashes key the record
    notes: str = ""
    exact_outputs: tuple[str, ...] = field(default=())  # outputs that must match bit for bit (tolerance 0)


def gate_dir() -> Path:
    return Path(os.environ.get(GATE_DIR_ENV) or Path.home() / ".cache" / "align" / "gates")


def record_path(name: str, kind: str) -> Path:
    return gate_dir() / f"{name}.{kind}.json"


_ROOT = Path(__file__).resolve().parents[2]


def source_digests(sources: tuple[str, ...]) -> dict[str, str]:
    return {s: hashlib.sha256((_ROOT / s).read_bytes()).hexdigest() for s in sources}


def device_name(dev: torch.device) -> str:
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu (triton interpreter)"


def compare(cand: torch.Tensor, ref: torch.Tensor, tol: Tolerance) -> dict:
    """Worst excess over the bound (<= 0 passes), the largest absolute error and reference, in fp64."""
    if cand.shape != ref.shape:
        return {"ok": False, "why": f"shape {tuple(cand.shape)} != reference {tuple(ref.shape)}"}
    c, r = cand.detach().double().cpu(), ref.detach().double().cpu()
    finite = torch.isfinite(r)
    if not torch.equal(torch.isfinite(c), finite):
        return {"ok": False, "why": "non-finite values where the reference has none (or the reverse)"}
    err = (c - r).abs()[finite]
    top = float(r.abs()[finite].max()) if err.numel() else 0.0
    bound = tol.abs_of_max * top + tol.rel * r.abs()[finite]
    excess = float((err - bound).max()) if err.numel() else 0.0
    over = torch.where(bound > 0, err / bound, torch.where(err > 0, torch.inf, 0.0))
    ratio = float(over.max()) if err.numel() else 0.0
    return {"ok": excess <= 0.0, "max_abs_err": float(err.max()) if err.numel() else 0.0,
            "max_abs_ref": top, "worst_excess": excess, "err_over_bound": ratio}


def run_gate(spec: GateSpec, dev: torch.device, candidate: Callable[[dict], Outputs] | None = None,
             write: bool = True) -> dict:
    """Run every case of `spec` for `dev`'s kind; return (and with `write`, record) the result. `candidate`
    replaces the spec's kernel (tests feed a wrong kernel to prove the gate refuses it)."""
    kind = triton_rt.device_kind(dev)
    if kind not in spec.cases:
        raise triton_rt.TritonUnavailable(f"gate {spec.name!r} has no cases for device kind {kind!r} ({dev})")
    run = candidate or spec.candidate
    cases = []
    for i, case in enumerate(spec.cases[kind]):
        gen = torch.Generator(device="cpu").manual_seed(1234 + i)
        inputs = spec.make_inputs(case, dev, gen)
        ref, got = spec.reference(inputs), run(inputs)
        tol = spec.tolerance[case.dtype]
        checks = {}
        for key, want in ref.items():
            exact = Tolerance(0.0, 0.0) if key in spec.exact_outputs else tol
            checks[key] = compare(got[key], want, exact) if key in got else {"ok": False, "why": "missing"}
        cases.append({"label": case.label, "dtype": str(case.dtype).removeprefix("torch."),
                      "ok": all(c["ok"] for c in checks.values()), "outputs": checks})
    record = {"name": spec.name, "kind": kind, "device": device_name(dev), "passed": all(c["ok"] for c in cases),
              "triton": triton_rt.version(), "torch": torch.__version__,
              "sources": source_digests(spec.sources), "notes": spec.notes,
              "tolerances": {str(d).removeprefix("torch."): {"abs_of_max": t.abs_of_max, "rel": t.rel}
                             for d, t in spec.tolerance.items()},
              "exact_outputs": list(spec.exact_outputs), "cases": cases}
    if write:
        _write_atomic(record_path(spec.name, kind), record)
        forget()
    return record


def _write_atomic(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


@lru_cache(maxsize=None)
def _read_record(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return {"unreadable": str(exc)}


def forget() -> None:
    """Drop the in-process cache of records (after another process wrote some, or in tests)."""
    _read_record.cache_clear()
    _refusal.cache_clear()


def refusal(name: str, dev: torch.device) -> str | None:
    """Why the recorded gate of kernel `name` does not let it run on `dev` (None: it passed, and still applies)."""
    return _refusal(record_path(name, triton_rt.device_kind(dev)), device_name(dev) if dev.type == "cuda" else "")


@lru_cache(maxsize=None)
def _refusal(path: Path, cuda_name: str) -> str | None:
    """Cached per process (the selector asks on every forward); `forget` drops it."""
    kind = path.name.split(".")[-2]
    rec = _read_record(path)
    if rec is None:
        return f"no gate record {path}"
    if "unreadable" in rec:
        return f"gate record {path} unreadable: {rec['unreadable']}"
    if not rec.get("passed"):
        bad = [c["label"] + " " + c["dtype"] for c in rec.get("cases", []) if not c.get("ok")]
        return f"the gate failed ({path}: {', '.join(bad) or 'no case'})"
    if rec.get("triton") != triton_rt.version() or rec.get("torch") != torch.__version__:
        return f"gate record {path} is for triton {rec.get('triton')} / torch {rec.get('torch')}"
    if kind == "cuda" and rec.get("device") != cuda_name:
        return f"gate record {path} is for {rec.get('device')}, this device is {cuda_name}"
    try:
        now = source_digests(tuple(rec.get("sources", {})))
    except OSError as exc:
        return f"gate record {path}: {exc}"
    if not rec.get("sources") or now != rec["sources"]:
        return f"gate record {path} was made for other kernel sources"
    return None
