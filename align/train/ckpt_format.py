"""`WeightFormat`: how the Trainer writes and reads a model's weight files, so its checkpoint code is the same for
every family. `DenseFormat` (Mistral: the state dict is the file) and `OlmoeFormat` (fused experts in memory, the
hub's per-expert keys on disk) differ only in the family they name in align.model.family; `weight_format_for`
picks the format from the model's class (the family is injected by what was built, never sniffed from keys).

Tokenizers ride along only from an explicit `tokenizer_dir` (align.model.checkpoint.save_state_dict); which
families may fall back to the vendored Mistral tokenizer on load is the family's `vendored_tokenizer`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

from align.model.checkpoint import save_state_dict
from align.model.family import FAMILIES, Family, family_of_model
from align.model.safetensors_io import weight_map


class WeightFormat:
    """Write a full state dict as an HF checkpoint; stream one back in the model's own layout."""

    family: Family

    def write(self, model, weights: dict[str, torch.Tensor], out_dir: Path, **kwargs) -> Path:
        """kwargs: align.model.checkpoint.save_state_dict's (tokenizer_dir, inputs, dtype, max_shard_bytes)."""
        if model.config.tie_word_embeddings:
            weights = {k: v for k, v in weights.items() if k != "lm_head.weight"}  # the tie lives in config.json
        return save_state_dict(weights, model.config, out_dir, architecture=model.hf_architecture,
                               config_extra=model.hf_config_extra(), **kwargs)

    def read(self, model, model_dir: Path) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, tensor) pairs in `model`'s layout, read one tensor at a time."""
        return self.family.from_file(_file_pairs(model_dir), model.config)


def _file_pairs(model_dir: Path) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    for path in sorted(set(weight_map(model_dir).values())):
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():
                yield key, f.get_tensor(key)


class DenseFormat(WeightFormat):
    family = FAMILIES["mistral"]


class OlmoeFormat(WeightFormat):
    family = FAMILIES["olmoe"]


class FamilyFormat(WeightFormat):
    """Any other registered family (Llama, Qwen 2, Qwen 3): its layouts are the family's own functions."""

    def __init__(self, family: Family):
        self.family = family


FORMATS: dict[str, WeightFormat] = {f.family.name: f for f in (DenseFormat(), OlmoeFormat())}
FORMATS.update({name: FamilyFormat(family) for name, family in FAMILIES.items() if name not in FORMATS})


def weight_format_for(model) -> WeightFormat:
    return FORMATS[family_of_model(model).name]
