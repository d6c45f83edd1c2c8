"""Hugging Face-layout checkpoints: save (staged, fsynced, published by rename, manifest last), load (strict key,
shape and dtype checks, streaming), snapshot directories, the tokenizer fallback, and the content hash.

A checkpoint directory holds `config.json`, `model.safetensors` (or shards + index), optional tokenizer files, and,
when align wrote it, `manifest.json` (kind "hf_checkpoint", with the content hash). transformers'
`from_pretrained` loads it; a directory transformers wrote (or a hub snapshot) loads here.

Under FSDP2, gather a full state dict on rank 0 first (`get_model_state_dict(full_state_dict=True,
cpu_offload=True)`) and pass it to `save_state_dict`; `save_checkpoint` takes an unsharded model.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from pathlib import Path

import torch

from align.exceptions import ArtifactError, CheckpointError
from align.model.attention import AttentionConfig
from align.model.family import family_of_config, family_of_model
from align.model.hf_config import CONFIG_FILE, MistralConfig
from align.model.config_io import load_hf_config, save_hf_config
from align.model.mistral import MistralForCausalLM, MistralForProcessReward
from align.model.safetensors_io import FLOAT_DTYPES, hash_tensors, read_header, read_into, weight_map, write_weights
from align.utils.fsio import disk_errors, publish_dir, staging_dir
from align.utils.manifest import MANIFEST, read_manifest, write_manifest

# A config's dtype name ("float32" | "bfloat16", the Literal every stage config uses) -> the torch dtype.
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}

CHECKPOINT_KIND = "hf_checkpoint"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "tokenizer.model.v3", "chat_template.jinja")
VENDORED_TOKENIZER_VOCAB = 32768  # the vendored Mistral v0.3 tokenizer, the fallback when a snapshot has none


def resolve_checkpoint_dir(path: str | os.PathLike) -> Path:
    """A checkpoint directory, or a hub cache root (`models--org--name/`) resolved through `refs/main`."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: does not exist")
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a directory; a checkpoint is a directory with {CONFIG_FILE} and weights")
    ref = path / "refs" / "main"
    if ref.is_file() and (path / "snapshots").is_dir():
        snapshot = path / "snapshots" / ref.read_text().strip()
        if not snapshot.is_dir():
            raise CheckpointError(f"{ref}: names snapshot {snapshot.name!r}, which is missing")
        return snapshot
    return path


def save_state_dict(state: dict[str, torch.Tensor], cfg: MistralConfig, out_dir: str | os.PathLike, *,
                    architecture: str = MistralForCausalLM.hf_architecture, config_extra: dict | None = None,
                    max_shard_bytes: int | None = None, tokenizer_dir: str | os.PathLike | None = None,
                    dtype: torch.dtype | None = None, inputs: dict | None = None) -> Path:
    """Write a full (unsharded, on-CPU-able) state dict as an HF checkpoint at `out_dir`, atomically, in the file
    layout of `cfg`'s family (OLMoE: the hub's per-expert keys)."""
    state = family_of_config(cfg).to_file(state)
    final = Path(out_dir)
    staging = staging_dir(final)
    nbytes = sum(t.numel() * (dtype.itemsize if dtype is not None and t.is_floating_point() else t.element_size())
                 for t in state.values())
    with disk_errors(final, nbytes):  # a full disk: staging removed, then one DiskFullError (exit 84)
        return _save_staged(state, cfg, staging, final, architecture, config_extra, max_shard_bytes, tokenizer_dir,
                            dtype, inputs)


def _save_staged(state, cfg, staging: Path, final: Path, architecture, config_extra, max_shard_bytes, tokenizer_dir,
                 dtype, inputs) -> Path:
    try:
        write_weights(state, staging, max_shard_bytes, dtype)
        floats = [t.dtype for t in state.values() if t.is_floating_point()]
        saved = dtype or (floats[0] if floats else torch.float32)
        save_hf_config(cfg, staging, architecture=architecture, dtype=str(saved).removeprefix("torch."),
                       extra=config_extra)
        if tokenizer_dir is not None:
            copy_tokenizer_files(Path(tokenizer_dir), staging)
        write_manifest(staging, CHECKPOINT_KIND, inputs=inputs, extra={"content_hash": content_hash(staging)})
        return publish_dir(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def save_checkpoint(model, out_dir: str | os.PathLike, *, max_shard_bytes: int | None = None,
                    tokenizer_dir: str | os.PathLike | None = None, dtype: torch.dtype | None = None,
                    inputs: dict | None = None, state: dict[str, torch.Tensor] | None = None) -> Path:
    """Save an align Mistral model (causal LM, value head or PRM) in the HF layout; tied lm_head is not written.
    `state`: these full weights instead of the model's own (a sharded model's, gathered by
    align.train.train_module.full_state_dict)."""
    state = dict(model.state_dict() if state is None else state)
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # as transformers: the tie is in config.json, not in the file
    return save_state_dict(state, model.config, out_dir, architecture=model.hf_architecture,
                           config_extra=model.hf_config_extra(), max_shard_bytes=max_shard_bytes,
                           tokenizer_dir=tokenizer_dir, dtype=dtype, inputs=inputs)


def copy_tokenizer_files(src: Path, dst: Path) -> list[str]:
    if not (src / "tokenizer.json").is_file():
        raise CheckpointError(f"{src}: no tokenizer.json to copy into the checkpoint")
    copied = [name for name in TOKENIZER_FILES if (src / name).is_file()]
    for name in copied:
        shutil.copyfile(src / name, dst / name)
    return copied


def _check_manifest(ckpt: Path) -> dict | None:
    """An align-written checkpoint is checked against its manifest (sizes and sha256s, through the stat cache: a
    flipped bit is refused, an unchanged file is not rehashed); hub ones have none."""
    if not (ckpt / MANIFEST).is_file():
        return None
    try:
        return read_manifest(ckpt, kind=CHECKPOINT_KIND, verify_hashes=True)
    except ArtifactError as exc:
        raise CheckpointError(str(exc)) from exc


def _plan_load(model, ckpt: Path, ignore_missing: tuple[str, ...], ignore_unexpected: tuple[str, ...]):
    """Check every key, shape and dtype against the files' headers before any tensor is read."""
    mapping = weight_map(ckpt)
    params = family_of_model(model).file_targets(model.state_dict(keep_vars=True))
    tied = model.config.tie_word_embeddings and "lm_head.weight" in params
    if tied:
        params.pop("lm_head.weight")
    headers = {path: read_header(path) for path in sorted(set(mapping.values()))}
    errors = []
    missing = [k for k in params if k not in mapping and not k.startswith(ignore_missing)]
    unexpected = [f"{k} (in {mapping[k].name})" for k in mapping if k not in params
                  and not (tied and k == "lm_head.weight") and not k.startswith(ignore_unexpected)]
    if missing:
        errors.append(f"missing keys {missing}")
    if unexpected:
        errors.append(f"unexpected keys {unexpected}")
    by_file: dict[Path, list[str]] = {}
    for key, path in mapping.items():
        if key not in params:
            continue
        if key not in headers[path]:
            errors.append(f"{path.name}: key {key!r} is in the index but not in the file")
            continue
        file_dtype, shape = headers[path][key]
        want = tuple(params[key].shape)
        if shape != want:
            errors.append(f"{path.name}: {key} has shape {list(shape)}, model expects {list(want)}")
        elif file_dtype not in FLOAT_DTYPES:
            errors.append(f"{path.name}: {key} has dtype {file_dtype}, expected one of {sorted(FLOAT_DTYPES)}")
        else:
            by_file.setdefault(path, []).append(key)
    if errors:
        raise CheckpointError(f"{ckpt}: weights do not fit the model: " + "; ".join(errors))
    return params, by_file


@torch.no_grad()
def load_weights_into(model, dir: str | os.PathLike, *, ignore_missing: tuple[str, ...] = (),
                      ignore_unexpected: tuple[str, ...] = ()) -> None:
    """Copy a checkpoint's weights into `model` (any dtype/device), tensor by tensor.

    Strict: every missing and unexpected key is named, unless it starts with an ignored prefix (e.g. a value
    model initialised from a policy: ignore_missing=("score.",), ignore_unexpected=("lm_head.",))."""
    ckpt = resolve_checkpoint_dir(dir)
    _check_manifest(ckpt)
    params, by_file = _plan_load(model, ckpt, tuple(ignore_missing), tuple(ignore_unexpected))
    read_into(by_file, params)
    model.tie_weights()


def _head_kwargs(cls, ckpt: Path) -> dict:
    if not issubclass(cls, MistralForProcessReward):  # every family's token-classification head
        return {}
    raw = json.loads((ckpt / CONFIG_FILE).read_text())
    return {"num_labels": len(raw.get("id2label") or {"0": "LABEL_0"})}


def load_checkpoint(dir: str | os.PathLike, *, dtype: torch.dtype = torch.float32, device="cpu",
                    attn: AttentionConfig | None = None, cls=None):
    """Build the model from config.json and load its weights. The family comes from config.json's model_type;
    `cls` (default: the family's causal LM) names the head: that family's model of the same role
    (`Family.model_like`: MistralForValueHead loads a Qwen 2 reward model as Qwen2ForValueHead). Parameters are
    allocated once,
    directly in `dtype` on `device` (meta-device build), and filled tensor by tensor: never two full copies."""
    ckpt = resolve_checkpoint_dir(dir)
    cfg = load_hf_config(ckpt)
    family = family_of_config(cfg)
    try:  # a head class of another family names the role: this family's model of the same head is built
        cls = family.causal_lm if cls is None else family.model_like(cls)
    except CheckpointError:
        raise CheckpointError(f"{ckpt}: a {family.name} checkpoint cannot be loaded as {cls.__name__} "
                              f"(family models: {[m.__name__ for m in family.models]})") from None
    with torch.device("meta"):
        model = cls(cfg, attn, init=False, **_head_kwargs(cls, ckpt)).to(dtype)
    model = model.to_empty(device=device)
    model.tie_weights()
    load_weights_into(model, ckpt)
    return model


def tokenizer_dir_for(dir: str | os.PathLike) -> Path | None:
    """The directory to load the tokenizer from: the snapshot's own files, or None (the vendored Mistral v0.3)
    when the snapshot has no tokenizer.json and its vocabulary is that tokenizer's size."""
    ckpt = resolve_checkpoint_dir(dir)
    if (ckpt / "tokenizer.json").is_file():
        return ckpt
    cfg = load_hf_config(ckpt)
    if not family_of_config(cfg).vendored_tokenizer:
        raise CheckpointError(f"{ckpt}: no tokenizer.json, and a {family_of_config(cfg).name} checkpoint has no "
                              "vendored fallback; pass an explicit tokenizer directory")
    if cfg.vocab_size != VENDORED_TOKENIZER_VOCAB:
        raise CheckpointError(f"{ckpt}: no tokenizer.json, and vocab_size {cfg.vocab_size} is not the vendored "
                              f"Mistral v0.3 tokenizer's {VENDORED_TOKENIZER_VOCAB}; cannot pick a tokenizer")
    return None


def load_tokenizer(dir: str | os.PathLike):
    """align.tokenizer.Tokenizer for a checkpoint, with the vendored fallback (see tokenizer_dir_for)."""
    from align.tokenizer import Tokenizer  # imported here: the model package does not need the tokenizer

    return Tokenizer.from_pretrained(tokenizer_dir_for(dir))


def content_hash(ckpt: Path) -> str:
    """sha256 of the architecture (parsed config, not its cosmetic fields) and every tensor's key, dtype, shape
    and bytes in key order: equal for the same weights however they are sharded."""
    cfg = load_hf_config(ckpt)
    raw = json.loads((ckpt / CONFIG_FILE).read_text())
    identity = {"config": dataclasses.asdict(cfg), "architectures": raw.get("architectures"),
                "labels": len(raw.get("id2label") or {})}
    h = hashlib.sha256(b"align-checkpoint-v1\0" + json.dumps(identity, sort_keys=True).encode())
    hash_tensors(weight_map(ckpt), h)
    return h.hexdigest()


def checkpoint_content_hash(dir: str | os.PathLike, *, recompute: bool = False) -> str:
    """Identity of a checkpoint (weights + config), the key of the ref cache and of eval receipts.

    An align-written checkpoint stores it in its manifest (after the manifest's size checks pass); `recompute`
    or a checkpoint without a manifest (transformers, the hub) hashes the files."""
    ckpt = resolve_checkpoint_dir(dir)
    manifest = _check_manifest(ckpt)
    if manifest is not None and not recompute and manifest.get("content_hash"):
        return manifest["content_hash"]
    return content_hash(ckpt)
