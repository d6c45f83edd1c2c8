"""safetensors files in the Hugging Face layout: one `model.safetensors`, or shards
`model-0000N-of-0000M.safetensors` with `model.safetensors.index.json` ({"metadata": {"total_size"}, "weight_map":
{key: file}}).

Reading is streaming: each tensor's bytes are read from its file straight into the destination parameter, so
loading never holds a second copy of the weights, and (unlike safetensors' `get_tensor`, which copies out of a
memory map) not even a second copy of one tensor when the file's dtype is the parameter's. Every safetensors
error is re-raised as `CheckpointError` naming the file.
"""

from __future__ import annotations

import hashlib
import json
import struct
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from align.exceptions import CheckpointError

WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
FLOAT_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}


def shard_name(i: int, n: int) -> str:
    return f"model-{i:05d}-of-{n:05d}.safetensors"


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def plan_shards(state: dict[str, torch.Tensor], max_shard_bytes: int | None) -> list[list[str]]:
    """Keys grouped into shards in state-dict order; a tensor larger than the limit gets a shard of its own."""
    if max_shard_bytes is None:
        return [list(state)]
    shards: list[list[str]] = [[]]
    size = 0
    for key, t in state.items():
        nbytes = tensor_bytes(t)
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(key)
        size += nbytes
    return shards


def write_weights(state: dict[str, torch.Tensor], out_dir: Path, max_shard_bytes: int | None = None,
                  dtype: torch.dtype | None = None) -> list[str]:
    """Write `state` as HF safetensors into `out_dir` (not fsynced: the caller publishes the directory).

    Only one shard's converted tensors are alive at a time. Returns the file names written."""
    shards = plan_shards(state, max_shard_bytes)
    if len(shards) == 1:
        names = [WEIGHTS_FILE]
    else:
        names = [shard_name(i + 1, len(shards)) for i in range(len(shards))]
    weight_map, total = {}, 0
    for name, keys in zip(names, shards):
        tensors = {}
        for key in keys:
            t = state[key].detach().to("cpu")
            if dtype is not None and t.is_floating_point():
                t = t.to(dtype)
            tensors[key] = t.contiguous()
            weight_map[key] = name
            total += tensor_bytes(tensors[key])
        save_file(tensors, str(out_dir / name), metadata={"format": "pt"})
        del tensors
    if len(names) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (out_dir / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
        names.append(INDEX_FILE)
    return names


def weight_map(ckpt_dir: Path) -> dict[str, Path]:
    """key -> file for the checkpoint's weights (index if sharded, else model.safetensors)."""
    index_path = ckpt_dir / INDEX_FILE
    if index_path.is_file():
        try:
            index = json.loads(index_path.read_text())
            mapping = index["weight_map"]
            if not isinstance(mapping, dict):
                raise TypeError("weight_map is not an object")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{index_path}: unreadable index ({exc!r}); expected "
                                  "{'weight_map': {key: file}}") from exc
        files = {name: ckpt_dir / name for name in set(mapping.values())}
        for name, path in sorted(files.items()):
            if not path.is_file():
                raise CheckpointError(f"{path}: listed in {index_path} but missing")
        return {key: files[name] for key, name in mapping.items()}
    single = ckpt_dir / WEIGHTS_FILE
    if single.is_file():
        return {key: single for key in read_header(single)}
    present = sorted(p.name for p in ckpt_dir.iterdir()) if ckpt_dir.is_dir() else []
    raise CheckpointError(f"{ckpt_dir}: no {WEIGHTS_FILE} or {INDEX_FILE}; not a safetensors checkpoint "
                          f"(found: {present[:12]})")


@contextmanager
def open_file(path: Path):
    try:
        with safe_open(str(path), framework="pt") as f:
            yield f
    except SafetensorError as exc:
        raise CheckpointError(f"{path}: unreadable safetensors file ({exc}); truncated or not safetensors") from exc


def read_header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """key -> (safetensors dtype string, shape), read without loading any tensor data."""
    with open_file(path) as f:
        out = {}
        for key in f.keys():
            sl = f.get_slice(key)
            out[key] = (sl.get_dtype(), tuple(sl.get_shape()))
        return out


def read_into(files: dict[Path, list[str]], dest: dict[str, torch.Tensor]) -> None:
    """Read each listed tensor's bytes straight from its file into `dest[key]` (a CPU, contiguous tensor of the
    file's dtype is filled in place; otherwise one tensor-sized buffer is read and copied, casting dtype/device).

    No memory map and no intermediate copy of a whole file: peak memory is the destination plus one tensor."""
    for path, keys in files.items():
        read_header(path)  # safetensors validates the file (header, coverage) before we trust its offsets
        base, header = raw_header(path)
        with open(path, "rb") as fh:
            for key in keys:
                meta = header[key]
                target = dest[key].detach()
                dtype = FLOAT_DTYPES[meta["dtype"]]
                in_place = target.dtype == dtype and target.device.type == "cpu" and target.is_contiguous()
                buf = target if in_place else torch.empty(meta["shape"], dtype=dtype)
                start, end = meta["data_offsets"]
                fh.seek(base + start)
                view = memoryview(buf.reshape(-1).view(torch.uint8).numpy())
                if end - start != len(view) or fh.readinto(view) != len(view):
                    raise CheckpointError(f"{path}: tensor {key!r} is truncated or has a wrong size")
                if not in_place:
                    target.copy_(buf)


def raw_header(path: Path) -> tuple[int, dict]:
    """(offset of the data section, header dict) parsed from the file itself, as the format defines it."""
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
    header.pop("__metadata__", None)
    return 8 + n, header


def hash_tensors(mapping: dict[str, Path], h: "hashlib._Hash", chunk: int = 1 << 24) -> None:
    """Feed every tensor's key, dtype, shape and raw bytes, in sorted key order, into `h`.

    Independent of how the weights are split into files and of safetensors' header layout, so the same weights
    saved sharded and unsharded hash equal."""
    headers: dict[Path, tuple[int, dict]] = {}
    for key in sorted(mapping):
        path = mapping[key]
        if path not in headers:
            read_header(path)  # validates the file (truncation) before we trust its offsets
            headers[path] = raw_header(path)
        base, header = headers[path]
        meta = header[key]
        start, end = meta["data_offsets"]
        h.update(json.dumps([key, meta["dtype"], meta["shape"]]).encode())
        with open(path, "rb") as fh:
            fh.seek(base + start)
            left = end - start
            while left:
                block = fh.read(min(chunk, left))
                if not block:
                    raise CheckpointError(f"{path}: tensor {key!r} truncated")
                h.update(block)
                left -= len(block)
