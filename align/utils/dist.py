"""Process-group helpers that work the same with one process and no process group.

Every function here answers for the single-process case without touching torch.distributed, so a stage runs
unchanged under `python -m` (world 1) and under `torchrun` (world N). The control plane reduces its rank-local
flags through `all_reduce_max`: a decision is taken only after every rank has contributed to the same reduce.

Timeout: `ALIGN_PG_TIMEOUT_S` (default 1800 s) bounds every collective, so a real hang ends with an error (and, on
CUDA, the NCCL flight-recorder dump under `<run_dir>/nccl_trace/`) instead of holding the machine forever."""

from __future__ import annotations

import atexit
import datetime
import logging
import os
import sys
from pathlib import Path
from typing import Any, NoReturn, Sequence

import torch
import torch.distributed as dist

PG_TIMEOUT_ENV = "ALIGN_PG_TIMEOUT_S"
DEFAULT_PG_TIMEOUT_S = 1800.0


def pg_timeout_s() -> float:
    """Collective timeout from the environment; a malformed value is an error, not a silent default."""
    raw = os.environ.get(PG_TIMEOUT_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_PG_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{PG_TIMEOUT_ENV}={raw!r}: expected a number of seconds") from None
    if not value > 0:
        raise ValueError(f"{PG_TIMEOUT_ENV}={raw!r}: expected a positive number of seconds")
    return value


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def is_rank0() -> bool:
    return rank() == 0


def env_world_size() -> int:
    """World size the launcher asked for (torchrun sets WORLD_SIZE); 1 under plain `python -m`."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def device() -> torch.device:
    """This rank's compute device: its local GPU under CUDA, else the CPU."""
    if torch.cuda.is_available():
        visible = torch.cuda.device_count()
        if local_rank() >= visible:  # NOTE: else NCCL fails later with an invalid-ordinal error far from the cause
            raise RuntimeError(f"LOCAL_RANK {local_rank()} has no GPU: {visible} CUDA device(s) visible; launch at "
                               f"most {visible} ranks per node, or hide the GPUs (CUDA_VISIBLE_DEVICES='') for CPU")
        return torch.device("cuda", local_rank())
    return torch.device("cpu")


def init_distributed(run_dir: str | os.PathLike | None = None, timeout_s: float | None = None,
                     backend: str | None = None) -> bool:
    """Join the process group when launched with WORLD_SIZE > 1; return whether a group is active.

    Idempotent. With WORLD_SIZE 1 (or unset) nothing is initialised and every helper answers for one process."""
    if is_distributed():
        return True
    if env_world_size() <= 1:
        return False
    backend = backend or default_backend()
    if backend == "nccl":
        torch.cuda.set_device(local_rank())
        if run_dir is not None:
            _arm_flight_recorder(Path(run_dir))
    timeout = datetime.timedelta(seconds=timeout_s if timeout_s is not None else pg_timeout_s())
    dist.init_process_group(backend=backend, timeout=timeout)
    # NOTE: a gloo group left alive at interpreter exit can abort the process ("terminate called without an active
    # exception", exit -6) while its threads are torn down; every exit path, a coordinated stop included, ends here.
    atexit.register(destroy)
    return True


def _arm_flight_recorder(run_dir: Path) -> None:
    # NOTE: the dump defaults to /tmp, where nobody looks and which may be cleaned; keep the evidence with the run.
    trace_dir = run_dir / "nccl_trace"
    trace_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000")
    os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    os.environ.setdefault("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", str(trace_dir / "rank_"))


def set_pg_timeout(seconds: float) -> None:
    """Shorten (or lengthen) the default group's collective timeout, e.g. once the first step has completed and
    the slow start-up collectives are behind. A no-op without a process group."""
    if is_distributed():
        from torch.distributed.distributed_c10d import _set_pg_timeout

        _set_pg_timeout(datetime.timedelta(seconds=seconds))


def destroy() -> None:
    if is_distributed():
        dist.destroy_process_group()


def exit_process(code: int) -> NoReturn:
    """End a process that joined a process group: destroy the group, flush, and leave without interpreter
    finalisation.

    NOTE: gloo's C++ threads belong to backend objects that DDP/FSDP modules, optimizer state and pending works keep
    alive past destroy_process_group. When Python's finalisation destroys them, std::terminate now and then aborts a
    rank that had finished cleanly ("terminate called without an active exception", SIGABRT: about 1 in 10
    two-rank launches on this host). Every file align writes is closed (and fsynced where it matters) before this
    point, so skipping finalisation loses nothing but that race."""
    destroy()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def all_reduce_max(values: Sequence[float | int | bool] | torch.Tensor) -> torch.Tensor:
    """Element-wise MAX of a small flag vector over all ranks, as a float64 CPU tensor.

    NOTE: every rank must call this at the same program point with the same length, or the ranks that did call it
    wait in the collective until the process-group timeout fires."""
    return _all_reduce(values, dist.ReduceOp.MAX)


def all_reduce_sum(values: Sequence[float | int] | torch.Tensor) -> torch.Tensor:
    """Element-wise SUM over all ranks as a float64 CPU tensor (identity with one process)."""
    return _all_reduce(values, dist.ReduceOp.SUM)


def _all_reduce(values, op) -> torch.Tensor:
    flat = torch.as_tensor(values, dtype=torch.float64).detach().reshape(-1).clone()
    if not is_distributed():
        return flat
    # NCCL reduces only device tensors; gloo only host ones.
    work = flat.to(device()) if dist.get_backend() == "nccl" else flat
    dist.all_reduce(work, op=op)
    return work.cpu()


def all_reduce_tensors_(tensors: Sequence[torch.Tensor], group=None) -> None:
    """In-place element-wise SUM of `tensors` over the ranks of `group` (default: all), packed into one buffer so
    the collective is one call whatever their number. Every rank must pass the same shapes in the same order."""
    if not tensors or not is_distributed():
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, group=group)
    torch._foreach_copy_(list(tensors), [f.view_as(t) for f, t in zip(flat.split([t.numel() for t in tensors]),
                                                                       tensors)])


def packable_grads(params) -> list[torch.Tensor]:
    """The gradients of the trainable `params`, a missing one set to zeros first: what a rank packs into
    `all_reduce_tensors_` for parameters kept outside DDP / FSDP2, the same layout on every rank even where this
    rank's backward never reached a parameter."""
    grads = []
    for p in params:
        if p.requires_grad:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
    return grads


def broadcast_tensors_(tensors: Sequence[torch.Tensor], src: int = 0) -> None:
    """Rank `src`'s values of `tensors` on every rank, in place (a replicated module kept outside DDP / FSDP2)."""
    if not is_distributed():
        return
    with torch.no_grad():
        for t in tensors:
            dist.broadcast(t, src=src)


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order (a one-element list without a process group)."""
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def gather_object(obj: Any, dst: int = 0) -> list[Any] | None:
    """Every rank's `obj` in rank order on rank `dst`, None on the others (a one-element list without a process
    group): what only one rank writes need not be pickled to every rank (a replicated critic's Adam state, say)."""
    if not is_distributed():
        return [obj]
    out: list[Any] | None = [None] * world_size() if rank() == dst else None
    dist.gather_object(obj, out, dst=dst)
    return out


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank `src`'s `obj` on every rank (the object itself without a process group)."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]
