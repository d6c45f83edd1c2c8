"""Sharded training checkpoints (`[train] checkpoint_format = "sharded"`): every rank writes its own shard of the
weights and of the optimizer state with torch.distributed.checkpoint (DCP); nothing is gathered on rank 0. The
default format ("hf", align.train.checkpoint) is unchanged. Layout:

    checkpoints/step_<N>/
        dcp/                  DCP files: one `__<rank>_0.distcp` per rank and `.metadata` (rank 0), holding
                              {"model": weights, "optim": optimizer state} keyed by parameter name
        model/config.json     the HF config (what the streaming export, align.train.export_hf, writes beside the
                              weights)
        resume.pt             counters, per-rank RNG / loader / module extra state, callbacks' state, pins, the
                              schedule step (rank 0; small)
        manifest.json         kind "train_checkpoint", {"step", "world_size", "identity", "layout": "sharded"}; last

Published exactly like the "hf" layout: staged, fsynced, renamed, manifest last, so a save killed at any point
leaves the previous checkpoint the newest complete one. DCP reshards on load: a checkpoint written by N ranks
resumes on M (the weights and optimizer moments are exact; the data order and RNG streams continue exactly only at
the same world size, so a different one takes rank r % N's)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from align.exceptions import CheckpointError, ConfigError
from align.model.moe_ep import expert_shard_params
from align.model.config_io import save_hf_config
from align.train import faults
from align.train.checkpoint import (DCP_METADATA, FORMAT, MODEL_DIR, RESUME_FILE, discard_staged, publish_staged,
                                    state_bytes, step_dir)
from align.utils.dist import barrier, broadcast_object, is_rank0, rank, world_size
from align.utils.fsio import disk_errors, sha256_file, staging_dir

LAYOUT = "sharded"
DCP_DIR = "dcp"
FORMATS = ("hf", LAYOUT)  # [train] checkpoint_format


def require_supported(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Refuse, before the first step, what DCP would save wrongly: per-rank optimizer state (adamw8bit), and expert
    shards that are plain tensors differing across ranks under one name (DCP would keep one rank's copy)."""
    if getattr(optimizer, "local_shard_state", False):
        raise ConfigError(f"checkpoint_format = 'sharded' needs optimizer state shaped like the parameters; "
                          f"{type(optimizer).__name__} keeps per-rank state: use checkpoint_format = 'hf'")
    if expert_shard_params(model):
        raise ConfigError("checkpoint_format = 'sharded' does not hold expert-parallel shards (plain per-rank "
                          "tensors under one name): use checkpoint_format = 'hf'")


def _states(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """{"model", "optim"}: DTensor shards under FSDP2, plain tensors in one process, keyed by parameter name."""
    require_supported(model, optimizer)
    msd, osd = get_state_dict(model, optimizer)
    return {"model": msd, "optim": osd}


def save_sharded(root, step: int, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer, resume: dict,
                 identity: dict | None, hf_config: dict) -> Path:
    """Collective: every rank writes its shard into the staging directory; rank 0 writes resume.pt, config.json
    and, after a barrier, the manifest, then publishes. `hf_config`: save_hf_config's (cfg, architecture, extra)."""
    states = _states(model, optimizer)  # refusals come before a staging directory exists
    final = step_dir(root, step)
    staging = Path(broadcast_object(str(staging_dir(final)) if is_rank0() else None))
    faults.at_save("save:begin", step)
    with disk_errors(final, state_bytes(_local(states)) + state_bytes(resume)):
        try:
            dcp.save(states, checkpoint_id=staging / DCP_DIR)
            if is_rank0():
                torch.save(dict(resume, format=FORMAT, step=step, world_size=world_size(), layout=LAYOUT),
                           staging / RESUME_FILE)
                save_hf_config(hf_config["cfg"], staging / MODEL_DIR, architecture=hf_config["architecture"],
                               dtype=hf_config["dtype"], extra=hf_config["extra"])
            faults.at_save("save:staged", step)
            barrier()  # every rank's shard is in staging before the manifest lists them
            meta = staging / DCP_METADATA  # a dot file: manifests skip it, so it is recorded here
            extra = {"step": step, "world_size": world_size(), "identity": identity, "layout": LAYOUT}
            if is_rank0():
                extra["dcp_metadata"] = {"bytes": meta.stat().st_size, "sha256": sha256_file(meta)}
            publish_staged(staging, final, step, extra)
        except BaseException:
            discard_staged(staging)
            raise
    barrier()  # no rank moves on (or exits) before the checkpoint is published
    return final


def load_sharded(ckpt: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Read this rank's part of the weights and optimizer state (DCP reshards to this world size) into `model` and
    `optimizer`; returns resume.pt's payload."""
    path = ckpt / RESUME_FILE
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated or foreign file: name it
        raise CheckpointError(f"{path}: unreadable resume state ({exc})") from exc
    if payload.get("format") != FORMAT or payload.get("layout") != LAYOUT:
        raise CheckpointError(f"{path}: format {payload.get('format')!r} layout {payload.get('layout')!r}, this "
                              f"code reads format {FORMAT} layout {LAYOUT!r}")
    states = _states(model, optimizer)
    dcp.load(states, checkpoint_id=ckpt / DCP_DIR)
    set_state_dict(model, optimizer, model_state_dict=states["model"], optim_state_dict=states["optim"])
    return payload


def rank_state(payload: dict) -> tuple[int, bool]:
    """Whose saved per-rank state (RNG, loader, extra) this rank resumes, and whether it is exactly its own."""
    saved = int(payload["world_size"])
    if saved != world_size() and is_rank0():
        print(f"trainer: resuming a checkpoint of {saved} ranks on {world_size()}: weights and optimizer state are "
              f"resharded exactly; data order and RNG streams continue from rank r % {saved}'s", flush=True)
    return rank() % saved, saved == world_size()


def _local(obj):
    if hasattr(obj, "to_local") and hasattr(obj, "placements"):
        return obj.to_local()
    if isinstance(obj, dict):
        return {k: _local(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_local(v) for v in obj]
    return obj
