"""Training checkpoints on disk: write (staged, fsynced, renamed, manifest last), find the newest complete one,
read it back, and prune old ones. The Trainer decides when; this module knows the layout:

    checkpoints/step_<N>/
        model/                HF-format weights + config.json + its own manifest (align.model.checkpoint)
        resume.pt             counters, per-rank RNG / loader / module extra state, callbacks' state, pins,
                              and (one rank) the TrainModule state (optimizer, schedule step)
        optimizer_rank<r>.pt  (several ranks) each rank's TrainModule state: no rank-0 gather of optimizer state
        manifest.json         kind "train_checkpoint", {"step", "world_size", "identity"}; written last

`identity` (align.train.identity) names the run the checkpoint belongs to: a config or input change makes the
Trainer set the old checkpoints aside (`supersede`) and start afresh instead of resuming them.

`step_<N>` is published by renaming its staging directory: a reader sees the whole checkpoint or nothing. A
directory whose manifest is missing, or whose files do not match the manifest's sizes (a truncated file), is not a
checkpoint: `latest_checkpoint` skips it with a warning and takes the next newest, by step number.

Every file is read with `torch.load(weights_only=True)`: only tensors and plain containers, never pickled code."""

from __future__ import annotations

import os
import re
import shutil
import warnings
from pathlib import Path

import torch

from align.exceptions import ArtifactError, CheckpointError
from align.train import faults
from align.utils.dist import barrier, broadcast_object, is_rank0, rank, world_size
from align.utils.fsio import disk_errors, publish_dir, sha256_file, staging_dir
from align.utils.guard import require_free_disk
from align.utils.manifest import read_manifest, write_manifest

KIND = "train_checkpoint"
RESUME_FILE = "resume.pt"
MODEL_DIR = "model"
DCP_METADATA = "dcp/.metadata"  # the sharded layout's (align.train.sharded_checkpoint) DCP index
FORMAT = 1
_STEP_DIR = re.compile(r"^step_(\d+)$")
_PARTIAL = re.compile(r"^step_\d+\.(partial|old)-\d+$")


def optimizer_file(r: int) -> str:
    return f"optimizer_rank{r}.pt"


def step_dir(root: str | os.PathLike, step: int) -> Path:
    return Path(root) / f"step_{step}"


def checkpoint_problem(ckpt: Path) -> str | None:
    """Why `ckpt` is not a complete checkpoint, or None: manifest present, kind right, every listed file present
    with the listed size, resume.pt and the weights among them."""
    try:
        manifest = read_manifest(ckpt, kind=KIND)
    except ArtifactError as exc:
        return str(exc)
    files = manifest["files"]
    for needed in (RESUME_FILE, f"{MODEL_DIR}/config.json"):
        if needed not in files:
            return f"{ckpt}: manifest lists no {needed}"
    ranks = manifest.get("world_size", 1)
    if manifest.get("layout") == "sharded":  # align.train.sharded_checkpoint: DCP shards, no per-rank .pt files
        return _sharded_problem(ckpt, manifest)
    if ranks > 1 and any(optimizer_file(r) not in files for r in range(ranks)):
        return f"{ckpt}: manifest lacks a per-rank optimizer file for one of {ranks} ranks"
    return None


def _sharded_problem(ckpt: Path, manifest: dict) -> str | None:
    """A sharded checkpoint lists one DCP file per rank; DCP's `.metadata` (a dot file, which manifests skip) is
    recorded under "dcp_metadata" with its size and sha256."""
    ranks = manifest.get("world_size", 1)
    if any(f"dcp/__{r}_0.distcp" not in manifest["files"] for r in range(ranks)):
        return f"{ckpt}: manifest lacks a DCP shard for one of {ranks} ranks"
    meta, want = ckpt / DCP_METADATA, manifest.get("dcp_metadata") or {}
    if not meta.is_file() or meta.stat().st_size != want.get("bytes"):
        return f"{ckpt}: {DCP_METADATA} missing or not the {want.get('bytes')} bytes the manifest lists"
    return None


def list_checkpoints(root: str | os.PathLike) -> list[tuple[int, Path]]:
    """(step, dir) of every `step_<N>` directory under `root`, newest first (by number, not by name)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return sorted(found, reverse=True)


def latest_checkpoint(root: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint under `root`; incomplete newer ones are skipped with a warning. The one chosen
    is verified against its manifest's sha256s: a checkpoint changed after it was published (a flipped bit) is never
    resumed, nor silently passed over for an older one: `CheckpointError` (exit 2) names the file and both hashes."""
    for _step, ckpt in list_checkpoints(root):
        problem = checkpoint_problem(ckpt)
        if problem is None:
            verify_checkpoint(ckpt)
            return ckpt
        warnings.warn(f"skipping incomplete checkpoint {ckpt.name}: {problem}", stacklevel=2)
    return None


def verify_checkpoint(ckpt: Path) -> None:
    """Every file of `ckpt` against its manifest's sha256 (the stat cache skips files unchanged since verified)."""
    try:
        manifest = read_manifest(ckpt, kind=KIND, verify_hashes=True)
    except ArtifactError as exc:
        raise CheckpointError(f"resume refused: {exc}") from None
    want = (manifest.get("dcp_metadata") or {}).get("sha256")
    if want is not None and (got := sha256_file(ckpt / DCP_METADATA)) != want:
        raise CheckpointError(f"resume refused: {ckpt / DCP_METADATA}: sha256 {got}, manifest {want}")


def save_checkpoint(root: str | os.PathLike, step: int, *, weights: dict[str, torch.Tensor], write_weights,
                    resume: dict, module_state: dict, identity: dict | None = None) -> Path:
    """Collective: every rank calls it with its own `module_state`; rank 0 passes the full `weights` and the
    `resume` payload (other ranks may pass empty dicts). `write_weights(state, dir)` writes the HF directory."""
    final = step_dir(root, step)
    staging = broadcast_object(str(staging_dir(final)) if is_rank0() else None)
    staging = Path(staging)
    faults.at_save("save:begin", step)  # fault-injection points: no-ops unless ALIGN_FAULTS arms them
    # A full disk: the staging directory is removed, then DiskFullError (exit 84) names it, the bytes and the free.
    with disk_errors(final, state_bytes(weights) + state_bytes(module_state) + state_bytes(resume)):
        _save_staged(staging, final, step, weights, write_weights, resume, module_state, identity)
    barrier()  # no rank moves on (or exits) before the checkpoint is published
    return final


def disk_plan(model: torch.nn.Module, keep_last: int) -> tuple[int, str]:
    """(bytes, how) a training run will write at most: `keep_last` checkpoints kept plus one being staged before the
    oldest is pruned, each the weights plus three fp32 tensors per trainable parameter (offload_adamw's master and
    two moments, the largest state: an upper bound for AdamW's two moments and the 8-bit ones), plus the final
    weights."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    moments = 3 * 4 * sum(p.numel() for p in model.parameters() if p.requires_grad)
    ckpt = weights + moments
    need = ckpt * (keep_last + 1) + weights
    return need, (f"checkpoint {ckpt} bytes (weights {weights} + optimizer {moments}) x (keep_last {keep_last} + 1 "
                  f"staged) + final {weights}")


def check_disk(root: str | os.PathLike, model: torch.nn.Module, keep_last: int) -> None:
    """Rank 0, before the first step: refuse (exit 83) when the disk cannot hold what the run will write."""
    if is_rank0():
        need, how = disk_plan(model, keep_last)
        require_free_disk(root, need, how)


def state_bytes(obj) -> int:
    """Bytes of the tensors in a (nested) state: what a save of it writes, headers aside."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(state_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(state_bytes(v) for v in obj)
    return 0


def _save_staged(staging: Path, final: Path, step: int, weights, write_weights, resume, module_state,
                 identity) -> None:
    try:
        world = world_size()
        if world > 1:  # NOTE: each rank writes its own shard of optimizer state; nothing is gathered to rank 0
            torch.save(module_state, staging / optimizer_file(rank()))
        if is_rank0():
            write_weights(weights, staging / MODEL_DIR)
            payload = dict(resume, format=FORMAT, step=step, world_size=world)
            if world == 1:
                payload["module"] = module_state
            torch.save(payload, staging / RESUME_FILE)
        faults.at_save("save:staged", step)
        barrier()  # every rank's file is in staging before the manifest lists them
        publish_staged(staging, final, step, {"step": step, "world_size": world, "identity": identity})
    except BaseException:
        discard_staged(staging)
        raise


def publish_staged(staging: Path, final: Path, step: int, extra: dict) -> None:
    """Every rank calls it after the barrier: rank 0 writes the manifest last and publishes by rename (the save's
    `save:manifest` / `save:published` fault points), whatever the checkpoint's layout."""
    if is_rank0():
        write_manifest(staging, KIND, extra=extra)
        faults.at_save("save:manifest", step)
        publish_dir(staging, final)
        faults.at_save("save:published", step)


def discard_staged(staging: Path) -> None:
    """A failed save leaves nothing: rank 0 removes the staging directory."""
    if is_rank0():
        shutil.rmtree(staging, ignore_errors=True)


def checkpoint_layout(ckpt: Path) -> str:
    """"hf" (this module's layout) or "sharded" (align.train.sharded_checkpoint), from the manifest."""
    return read_manifest(ckpt, kind=KIND).get("layout", "hf")


def checkpoint_identity(ckpt: Path) -> dict | None:
    """The run identity recorded in a complete checkpoint's manifest (None: written before identities existed)."""
    return read_manifest(ckpt, kind=KIND).get("identity")


def supersede(root: str | os.PathLike) -> Path | None:
    """Rank 0: move the checkpoints of a previous, different run aside to `<root>.superseded` (replacing an older
    one there), so they are kept for inspection once and never resumed. Returns where they went."""
    root = Path(root)
    if not is_rank0() or not root.exists():
        return None
    aside = root.with_name(root.name + ".superseded")
    shutil.rmtree(aside, ignore_errors=True)
    os.replace(root, aside)
    return aside


def load_resume(ckpt: Path) -> dict:
    """resume.pt of `ckpt`, with this rank's module state under "module"; refuses another world size."""
    path = ckpt / RESUME_FILE
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated or foreign file: name it
        raise CheckpointError(f"{path}: unreadable resume state ({exc})") from exc
    if payload.get("format") != FORMAT:
        raise CheckpointError(f"{path}: format {payload.get('format')!r}, this code reads {FORMAT}")
    if payload["world_size"] != world_size():
        raise CheckpointError(f"{path}: written by {payload['world_size']} ranks, this run has {world_size()}; "
                              "exact resume (per-rank optimizer, RNG and data state) needs the same world size")
    if world_size() > 1:
        opt_path = ckpt / optimizer_file(rank())
        payload["module"] = torch.load(opt_path, map_location="cpu", weights_only=True)
    return payload


def prune(root: str | os.PathLike, keep_last: int, pinned: set[int]) -> list[Path]:
    """Delete complete checkpoints beyond the newest `keep_last`, except pinned steps; rank 0 only."""
    removed = []
    if not is_rank0():
        return removed
    for leftover in Path(root).glob("step_*"):  # staging dirs of writers that died mid-save
        if _PARTIAL.match(leftover.name):
            shutil.rmtree(leftover, ignore_errors=True)
    kept = 0
    for step, ckpt in list_checkpoints(root):
        if checkpoint_problem(ckpt) is not None:
            continue  # never delete what we cannot read; a later run may want to inspect it
        kept += 1
        if kept > keep_last and step not in pinned:
            shutil.rmtree(ckpt, ignore_errors=True)
            removed.append(ckpt)
    return removed
