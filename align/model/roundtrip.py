"""Checkpoint round trip: what a stage published loads back into the same model, bit for bit.

`check_published(model, ckpt_dir)` is for a stage that has just published `ckpt_dir` from `model` (call it on
rank 0 with the unwrapped model, after `publish_final`): the checkpoint is loaded into a fresh model, every tensor
must equal the in-memory one exactly, and a forward pass on a fixed probe batch must give identical logits.
`roundtrip(model, work_dir)` does save -> load -> compare for a model that has no published copy yet (and removes
its scratch copy). Both raise `RoundtripError` naming the first tensor that differs; they return a small report
for the stage's metrics. Why bitwise: the checkpoint is the same bytes in the same dtype, so any difference is a
save/load bug (a dropped tie, a transposed shard, a dtype cast), never rounding."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from align.model.checkpoint import checkpoint_content_hash, load_checkpoint, save_checkpoint

PROBE_SHAPE = (2, 16)  # (batch, tokens) of the forward probe: small, and long enough to mix positions


class RoundtripError(RuntimeError):
    """A published checkpoint does not reproduce the model it was saved from."""


def probe_batch(vocab_size: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, PROBE_SHAPE, generator=gen)  # shape: (B, T)


@torch.no_grad()
def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        return model(ids.to(device)).float().cpu()  # shape: (B, T, V)
    finally:
        model.train(was_training)


def check_published(model, ckpt_dir: str | os.PathLike, weights: dict[str, torch.Tensor] | None = None) -> dict:
    """Load `ckpt_dir` and require exact equality with `model` (weights and probe logits). `weights` (full CPU
    tensors, e.g. gathered from FSDP shards on rank 0) replaces `model.state_dict()` as the expected tensors; the
    probe forward then runs on a CPU copy of `model`'s class built from them, since a sharded model cannot run a
    forward on one rank alone."""
    if weights is not None:
        model = _model_from(model, weights)
    dtype = next(model.parameters()).dtype
    loaded = load_checkpoint(ckpt_dir, dtype=dtype, device="cpu", cls=type(model))
    mine = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    theirs = loaded.state_dict()
    if set(mine) != set(theirs):
        extra, absent = sorted(set(theirs) - set(mine)), sorted(set(mine) - set(theirs))
        raise RoundtripError(f"{ckpt_dir}: keys differ: only in the checkpoint {extra[:5]}, only in the model "
                             f"{absent[:5]}")
    for key in sorted(mine):
        a, b = mine[key], theirs[key]
        if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
            raise RoundtripError(f"{ckpt_dir}: tensor {key} differs after the round trip "
                                 f"({a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)})")
    ids = probe_batch(model.config.vocab_size)
    before, after = _logits(model, ids), _logits(loaded, ids)
    if not torch.equal(before, after):
        raise RoundtripError(f"{ckpt_dir}: forward differs after the round trip (max |diff| "
                             f"{(before - after).abs().max().item():.3g}) although every tensor is equal")
    return {"tensors": len(mine), "content_hash": checkpoint_content_hash(ckpt_dir), "forward_equal": True}


def _model_from(model, weights: dict[str, torch.Tensor]):
    """A CPU model of `model`'s class and config holding `weights` (same dtype), for the probe forward."""
    dtype = next(iter(weights.values())).dtype
    with torch.device("meta"):
        fresh = type(model)(model.config, init=False).to(dtype)
    fresh = fresh.to_empty(device="cpu")
    fresh.load_state_dict(weights, strict=True, assign=True)
    fresh.tie_weights()
    return fresh


def roundtrip(model, work_dir: str | os.PathLike) -> dict:
    """save -> load -> compare in `work_dir/roundtrip` (removed afterwards, also on failure)."""
    scratch = Path(work_dir) / "roundtrip"
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        save_checkpoint(model, scratch)
        return check_published(model, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
