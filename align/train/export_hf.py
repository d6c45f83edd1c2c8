"""`python -m align.train.export_hf --checkpoint <step dir> --out <dir> [--max-shard-bytes N] [--dtype bfloat16]`:
a sharded training checkpoint (align.train.sharded_checkpoint) as an HF checkpoint, streamed, in one process, with
no process group. The weights are read from the DCP shards one output file at a time (the file plan comes from the
DCP metadata's sizes, nothing is loaded to make it), put into the family's file layout (align.model.family
`to_file`: key by key, so a group converts on its own) and written; only one output file's tensors are ever held,
never the whole model. The result is published like every HF checkpoint: staged, config.json, manifest with its
content hash last, renamed into place (align.model.checkpoint)."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torch.distributed.checkpoint import FileSystemReader

from align.exceptions import CheckpointError
from align.model.checkpoint import CHECKPOINT_KIND, content_hash
from align.model.config_io import load_hf_config
from align.model.family import family_of_config
from align.model.hf_config import CONFIG_FILE
from align.model.safetensors_io import INDEX_FILE, WEIGHTS_FILE, plan_shards, shard_name, tensor_bytes
from align.train.checkpoint import MODEL_DIR, checkpoint_layout, checkpoint_problem, verify_checkpoint
from align.train.sharded_checkpoint import DCP_DIR, LAYOUT
from align.utils.fsio import disk_errors, publish_dir, staging_dir
from align.utils.manifest import write_manifest

PREFIX = "model."  # the model's weights inside the DCP state ({"model": ..., "optim": ...}, flattened)


def weight_plan(ckpt: Path) -> dict[str, torch.Tensor]:
    """{model key: meta tensor of its full shape and dtype}, in the saved order, from the DCP metadata alone."""
    meta = FileSystemReader(str(ckpt / DCP_DIR)).read_metadata().state_dict_metadata
    return {k[len(PREFIX):]: torch.empty(m.size, dtype=m.properties.dtype, device="meta")
            for k, m in meta.items() if k.startswith(PREFIX) and hasattr(m, "chunks")}


def read_group(ckpt: Path, plan: dict[str, torch.Tensor], keys: list[str]) -> dict[str, torch.Tensor]:
    """The full tensors of `keys`, assembled from every rank's shard (DCP reads only these)."""
    state = {"model": {k: torch.empty(plan[k].shape, dtype=plan[k].dtype) for k in keys}}
    dcp.load(state, storage_reader=FileSystemReader(str(ckpt / DCP_DIR)), no_dist=True)
    return state["model"]


def export(ckpt: str | Path, out: str | Path, *, max_shard_bytes: int | None = None,
           dtype: torch.dtype | None = None) -> Path:
    ckpt, final = Path(ckpt), Path(out)
    problem = checkpoint_problem(ckpt)
    if problem is not None:
        raise CheckpointError(f"export refused: {problem}")
    if checkpoint_layout(ckpt) != LAYOUT:
        raise CheckpointError(f"{ckpt}: not a sharded checkpoint; its HF weights are already in {ckpt / MODEL_DIR}")
    verify_checkpoint(ckpt)
    cfg = load_hf_config(ckpt / MODEL_DIR)
    plan = weight_plan(ckpt)
    if cfg.tie_word_embeddings:
        plan.pop("lm_head.weight", None)  # as transformers: the tie is in config.json, not in the file
    groups = plan_shards(plan, max_shard_bytes)
    names = [WEIGHTS_FILE] if len(groups) == 1 else [shard_name(i + 1, len(groups)) for i in range(len(groups))]
    staging = staging_dir(final)
    with disk_errors(final, sum(tensor_bytes(t) for t in plan.values())):
        try:
            _write(ckpt, plan, groups, names, staging, family_of_config(cfg).to_file, dtype)
            shutil.copyfile(ckpt / MODEL_DIR / CONFIG_FILE, staging / CONFIG_FILE)
            write_manifest(staging, CHECKPOINT_KIND, extra={"content_hash": content_hash(staging)})
            return publish_dir(staging, final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise


def _write(ckpt, plan, groups, names, staging: Path, to_file, dtype) -> None:
    weight_map, total = {}, 0
    for name, keys in zip(names, groups):
        tensors = {}
        for key, t in to_file(read_group(ckpt, plan, keys)).items():
            t = t.to(dtype) if dtype is not None and t.is_floating_point() else t
            tensors[key] = t.contiguous()
            weight_map[key] = name
            total += tensor_bytes(tensors[key])
        save_file(tensors, str(staging / name), metadata={"format": "pt"})
        del tensors  # one output file's tensors at a time
    if len(names) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (staging / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m align.train.export_hf", description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", required=True, help="a sharded step checkpoint: <run>/checkpoints/step_<N>")
    ap.add_argument("--out", required=True, help="the HF checkpoint directory to publish")
    ap.add_argument("--max-shard-bytes", type=int, default=None, help="split the weights into files of this size")
    ap.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16"),
                    help="cast floating weights")
    args = ap.parse_args(argv)
    dtype = getattr(torch, args.dtype) if args.dtype else None
    try:
        path = export(args.checkpoint, args.out, max_shard_bytes=args.max_shard_bytes, dtype=dtype)
    except CheckpointError as exc:
        print(f"export_hf: {exc}", file=sys.stderr)
        return exc.exit_code
    print(f"export_hf: wrote {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
