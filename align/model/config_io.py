"""`config.json` read and written through the family its `model_type` names: the family-dispatching half of the
config code (align.model.hf_config holds the family-independent reader pieces, align.model.family the registry that
imports every family's model, so this module sits above both)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from align.model.family import family_of_config, family_of_config_dict
from align.model.hf_config import CONFIG_FILE, config_from_hf_dict, read_config_json
from align.utils.fsio import atomic_write_json


def load_hf_config(dir_or_file: str | os.PathLike):
    """Read `config.json` with the reader of the family its `model_type` names (align.model.family)."""
    data, path = read_config_json(dir_or_file)
    return config_from_hf_dict(data, str(path), family_of_config_dict(data, str(path)).spec)


def hf_config_dict(cfg, *, architecture: str = "MistralForCausalLM", dtype: str = "float32",
                   extra: dict | None = None) -> dict:
    """The `config.json` content transformers writes for this architecture (rope in both spellings)."""
    spec = family_of_config(cfg).spec
    data = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in spec.not_written}
    data.update(spec.written)
    scaling = cfg.rope_scaling.hf_dict() if cfg.rope_scaling is not None else {"rope_type": "default"}
    if "rope_scaling" in data:  # the transformers 4 spelling beside rope_theta, as the hub's files have it
        data["rope_scaling"] = scaling if cfg.rope_scaling is not None else None
    data.update({
        "architectures": [architecture], "model_type": spec.model_type,
        "rope_parameters": {"rope_theta": cfg.rope_theta, **scaling}, "dtype": dtype,
        "use_cache": True,
    })
    data.update(extra or {})
    return dict(sorted(data.items()))


def save_hf_config(cfg, dir: str | os.PathLike, **kwargs) -> Path:
    """Write `dir/config.json` atomically. kwargs: see `hf_config_dict`."""
    path = Path(dir) / CONFIG_FILE
    atomic_write_json(path, hf_config_dict(cfg, **kwargs))
    return path
