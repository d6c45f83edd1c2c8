"""Checkpoint identity for receipts and caches: what a reference-logprob cache is keyed by and what an evaluation
receipt records about the model it evaluated.

The identity is content, not path or time: `content_hash` covers the parsed architecture and every tensor's key,
dtype, shape and bytes (align.model.checkpoint.content_hash), so re-saving the same weights, sharded or not, keeps
it, and changing one weight or the stored dtype changes it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from math import prod

from align.model.checkpoint import checkpoint_content_hash, resolve_checkpoint_dir
from align.model.hf_config import CONFIG_FILE
from align.model.config_io import load_hf_config
from align.model.safetensors_io import read_header, weight_map


def checkpoint_identity(dir: str | os.PathLike) -> dict:
    """{"content_hash", "architecture", "config", "num_parameters", "dtypes", "path"} for a receipt's inputs."""
    ckpt = resolve_checkpoint_dir(dir)
    cfg = load_hf_config(ckpt)
    raw = json.loads((ckpt / CONFIG_FILE).read_text())
    files = sorted(set(weight_map(ckpt).values()))
    tensors = {key: meta for path in files for key, meta in read_header(path).items()}
    return {
        "content_hash": checkpoint_content_hash(ckpt),
        "architecture": (raw.get("architectures") or ["MistralForCausalLM"])[0],
        "config": dataclasses.asdict(cfg),
        "num_parameters": sum(prod(shape) for _dtype, shape in tensors.values()),
        "dtypes": sorted({dtype for dtype, _shape in tensors.values()}),
        "path": str(ckpt),
    }
