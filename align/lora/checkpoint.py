"""Step checkpoints of a LoRA run without the frozen base: `LoraWeightFormat` (the Trainer's `WeightFormat` seam,
align.train.ckpt_format), so checkpointing and resume code stay the Trainer's own.

A LoRA run's `checkpoints/step_<N>/model/` holds
    config.json            the model's HF config (what `checkpoint_problem` wants of every checkpoint)
    adapters.safetensors   the adapter tensors under the state dict's own names (`<m>.lora_{A,B}.weight`)
    lora_base.json         {"path", "content_hash"}: the frozen base, named, never copied
beside the Trainer's resume.pt (optimizer over the adapters, RNG, loader, module state). The base is the stage's
start checkpoint (GRPO/PPO `data.start`, DPO's reference, SFT's `model.base`); a from-scratch SFT base has no file,
so it is written ONCE per run, at the first checkpoint, to `checkpoints/lora_base/` (an ordinary HF checkpoint with
its content hash; a superseded run's checkpoints move aside together with it). Resume reads the base from the
stage's base directory and the adapters from the step, after checking that the base's content hash is the recorded
one: a changed base is one CheckpointError naming both, never a silent resume on other weights. A checkpoint
written before this layout (model/ holds the full state dict, no lora_base.json) still resumes through the family's
format. What a stage publishes is not this: `final/` is the merged HF checkpoint (align.lora.stage)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from align.exceptions import CheckpointError
from align.model.checkpoint import checkpoint_content_hash
from align.model.config_io import save_hf_config
from align.lora.adapters import ADAPTER_KEYS, LoraConfig
from align.train.ckpt_format import WeightFormat, weight_format_for

ADAPTERS_FILE = "adapters.safetensors"
BASE_REF_FILE = "lora_base.json"
SCRATCH_BASE = "lora_base"  # under the run's checkpoints/: a from-scratch base, written once


class LoraWeightFormat(WeightFormat):
    """`inner` (the model family's format) for the base; adapters + a reference to the base per step."""

    def __init__(self, inner: WeightFormat, base: Path, write_base: bool):
        self.inner, self.family = inner, inner.family
        self.base, self.write_base = Path(base), write_base
        self._base_hash: str | None = None  # the base's content hash, read once (a hub base hashes its files)

    def write(self, model, weights: dict[str, torch.Tensor], out_dir: Path, **kwargs) -> Path:
        if kwargs:
            raise TypeError(f"LoraWeightFormat writes step checkpoints only (got {sorted(kwargs)}); a stage publishes "
                            f"through align.lora.stage.publish_final")
        adapters = {k: v.detach().contiguous().cpu() for k, v in weights.items() if k.endswith(ADAPTER_KEYS)}
        if not adapters:
            raise ValueError("LoraWeightFormat: the state dict has no LoRA adapters")
        if self.write_base and not (self.base / "manifest.json").is_file():
            base = {k: v for k, v in weights.items() if not k.endswith(ADAPTER_KEYS)}
            self.inner.write(model, base, self.base)  # once per run: staged, published by rename, content-hashed
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True)
        save_file(adapters, str(out_dir / ADAPTERS_FILE), metadata={"format": "pt"})
        floats = [t.dtype for t in adapters.values()]
        save_hf_config(model.config, out_dir, architecture=model.hf_architecture,
                       dtype=str(floats[0]).removeprefix("torch."), extra=model.hf_config_extra())
        if self._base_hash is None:
            self._base_hash = checkpoint_content_hash(self.base)
        ref = {"path": str(self.base.resolve()), "content_hash": self._base_hash}
        (out_dir / BASE_REF_FILE).write_text(json.dumps(ref, indent=2) + "\n")
        return out_dir

    def read(self, model, model_dir: Path):
        model_dir = Path(model_dir)
        ref_path = model_dir / BASE_REF_FILE
        if not ref_path.is_file():  # the older layout: the full state dict in model/
            return self.inner.read(model, model_dir)
        ref = json.loads(ref_path.read_text())
        try:
            now = checkpoint_content_hash(self.base)
        except Exception as exc:  # noqa: BLE001 -- missing or unreadable: name it
            raise CheckpointError(f"{ref_path}: this LoRA checkpoint's frozen base {self.base} cannot be read "
                                  f"({exc}); resume needs the base it was trained on (recorded: {ref['path']}, "
                                  f"content hash {ref['content_hash']})") from exc
        if now != ref["content_hash"]:
            raise CheckpointError(f"{ref_path}: the LoRA base {self.base} changed since this checkpoint was written "
                                  f"(content hash {now}, recorded {ref['content_hash']} for {ref['path']}); resume "
                                  f"needs the frozen base the adapters were trained on")
        return self._pairs(model, model_dir)

    def _pairs(self, model, model_dir: Path):
        yield from self.inner.read(model, self.base)
        yield from load_file(str(model_dir / ADAPTERS_FILE)).items()


def lora_weight_format(lora: LoraConfig | None, model, base: str | Path | None,
                       run_dir: Path) -> LoraWeightFormat | None:
    """The Trainer's `weight_format` for a stage: None (the family's) without LoRA; with it adapters-only step
    checkpoints over `base` (the start checkpoint dir), or over a base written once under the run's checkpoints/
    when the policy starts from scratch (`base` None)."""
    if lora is None:
        return None
    inner = weight_format_for(model)
    if base is None:
        return LoraWeightFormat(inner, Path(run_dir) / "checkpoints" / SCRATCH_BASE, write_base=True)
    return LoraWeightFormat(inner, Path(base), write_base=False)
