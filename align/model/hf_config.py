"""`MistralConfig` and the Hugging Face `config.json` it is read from and written to.

Field names are the HF ones, so a hub `config.json` maps onto the dataclass key for key. Reading is strict: a
field that changes the architecture in a way this model does not implement (scaled RoPE, biases, another
activation, another model type) is refused with its name, never silently dropped. Both RoPE spellings are read:
`rope_theta` at the top level (transformers 4, the hub's Mistral-7B-v0.3) and `rope_parameters` (transformers 5).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path

from align.exceptions import CheckpointError
from align.utils.fsio import atomic_write_json

CONFIG_FILE = "config.json"


@dataclass(frozen=True)
class MistralConfig:
    """Architecture of a Mistral-family decoder. Defaults are the embedded tiny profile's shape (real v0.3 vocab)."""

    vocab_size: int = 32768
    hidden_size: int = 256
    intermediate_size: int = 768
    num_hidden_layers: int = 4
    num_attention_heads: int = 8
    num_key_value_heads: int = 2
    head_dim: int | None = None  # None: hidden_size // num_attention_heads (resolved in __post_init__)
    max_position_embeddings: int = 4096
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    sliding_window: int | None = None  # None: full causal attention (Mistral v0.2+)
    bos_token_id: int | None = 1
    eos_token_id: int | None = 2
    pad_token_id: int | None = None
    initializer_range: float = 0.02  # std of the truncated-normal init (cut at 3 std)

    def __post_init__(self):
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        problems = []
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "max_position_embeddings"):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be > 0, got {getattr(self, name)}")
        if self.num_attention_heads % max(self.num_key_value_heads, 1):
            problems.append(f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                            f"num_key_value_heads ({self.num_key_value_heads})")
        if self.head_dim % 2:
            problems.append(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.pad_token_id is not None and not 0 <= self.pad_token_id < self.vocab_size:
            problems.append(f"pad_token_id {self.pad_token_id} is outside the vocabulary [0, {self.vocab_size})")
        if self.sliding_window is not None and self.sliding_window <= 0:
            problems.append(f"sliding_window must be > 0 or None, got {self.sliding_window}")
        if problems:
            raise ValueError("MistralConfig: " + "; ".join(problems))

    @property
    def num_kv_groups(self) -> int:
        """Query heads per key/value head (the GQA ratio)."""
        return self.num_attention_heads // self.num_key_value_heads


# transformers' own defaults, used for keys a config.json omits (not our tiny defaults: a hub file that leaves
# out rms_norm_eps means transformers' 1e-6).
HF_DEFAULTS = {
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": None, "head_dim": None, "max_position_embeddings": 4096 * 32,
    "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "sliding_window": 4096,
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": None, "initializer_range": 0.02,
}
# Keys with no effect on the forward pass in this implementation (bookkeeping, generation, dtype of the file).
IGNORED_KEYS = frozenset({
    "architectures", "model_type", "transformers_version", "use_cache", "torch_dtype", "dtype", "_name_or_path",
    "output_attentions", "output_hidden_states", "return_dict", "id2label", "label2id", "num_labels",
    "problem_type", "tokenizer_class", "is_encoder_decoder", "chunk_size_feed_forward", "max_length",
    "classifier_dropout", "token_classification_bias", "_attn_implementation_autoset",
})
# Keys accepted only at the value this model implements.
REQUIRED_VALUES = {
    "hidden_act": ("silu",), "attention_dropout": (0, 0.0), "attention_bias": (False,), "mlp_bias": (False,),
    "rope_scaling": (None,), "pretraining_tp": (1,), "quantization_config": (None,),
}
MODEL_TYPES = ("mistral",)


@dataclass(frozen=True)
class ConfigSpec:
    """How one family's `config.json` maps onto its config dataclass (align.model.family holds one per family)."""

    cls: type
    model_type: str
    defaults: dict  # transformers' defaults for omitted keys
    ignored: frozenset  # keys with no effect on the forward pass
    required: dict  # keys accepted only at these values
    written: dict  # constant keys transformers writes for this family (the implemented values)
    aliases: dict = dataclasses.field(default_factory=dict)  # another spelling -> the field name
    not_written: tuple = ()  # dataclass fields the family's transformers config does not have


MISTRAL_SPEC = ConfigSpec(MistralConfig, "mistral", HF_DEFAULTS, IGNORED_KEYS, REQUIRED_VALUES,
                          written={"hidden_act": "silu", "attention_dropout": 0.0})


def config_from_hf_dict(data: dict, source: str = "<dict>", spec: ConfigSpec = MISTRAL_SPEC):
    """Map a parsed `config.json` onto the family's config, refusing anything the model does not implement."""
    if data.get("model_type", spec.model_type) != spec.model_type:
        raise CheckpointError(f"{source}: model_type is {data['model_type']!r}; this reader implements "
                              f"{spec.model_type!r}")
    data = {spec.aliases.get(k, k): v for k, v in data.items()}
    for key, allowed in spec.required.items():
        if key in data and data[key] not in allowed:
            raise CheckpointError(f"{source}: field {key!r} = {data[key]!r} is not implemented "
                                  f"(supported: {', '.join(repr(a) for a in allowed)})")
    fields = {f.name for f in dataclasses.fields(spec.cls)}
    values = {k: data.get(k, spec.defaults[k]) for k in fields if k != "rope_theta"}
    values["rope_theta"] = _rope_theta(data, source, spec.defaults)
    unknown = sorted(set(data) - fields - spec.ignored - set(spec.required) - {"rope_parameters"})
    if unknown:
        raise CheckpointError(f"{source}: unsupported field(s) {unknown}; refusing to guess their effect")
    if values["num_key_value_heads"] is None:
        values["num_key_value_heads"] = values["num_attention_heads"]
    if isinstance(values["eos_token_id"], list):
        raise CheckpointError(f"{source}: field 'eos_token_id' is a list {values['eos_token_id']}; one id expected")
    _check_types(values, source, spec.cls)
    try:
        return spec.cls(**values)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{source}: {exc}") from exc


def _rope_theta(data: dict, source: str, defaults: dict) -> float:
    params = data.get("rope_parameters")
    if params is None:
        return float(data.get("rope_theta", defaults["rope_theta"]))
    if not isinstance(params, dict):
        raise CheckpointError(f"{source}: field 'rope_parameters' must be an object, got {params!r}")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise CheckpointError(f"{source}: field 'rope_parameters.rope_type' = {rope_type!r} is not implemented "
                              "(only unscaled 'default' RoPE)")
    extra = sorted(set(params) - {"rope_type", "type", "rope_theta"})
    if extra:
        raise CheckpointError(f"{source}: field 'rope_parameters' has unsupported keys {extra}")
    return float(params.get("rope_theta", data.get("rope_theta", defaults["rope_theta"])))


def _check_types(values: dict, source: str, cls: type) -> None:
    for f in dataclasses.fields(cls):
        v = values[f.name]
        optional = "None" in str(f.type)
        if v is None and optional:
            continue
        want = {"int": int, "float": (int, float), "bool": bool}[str(f.type).split(" ")[0]]
        if isinstance(v, bool) and want is not bool or not isinstance(v, want):
            raise CheckpointError(f"{source}: field {f.name!r} = {v!r}; expected {f.type}")
        if want == (int, float):
            values[f.name] = float(v)


def read_config_json(dir_or_file: str | os.PathLike) -> tuple[dict, Path]:
    """The parsed `config.json` of a checkpoint directory (or the file itself) and its path."""
    path = Path(dir_or_file)
    if path.is_dir():
        path = path / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"{path}: no config.json; not a Hugging Face checkpoint directory")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: unreadable config.json ({exc})") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: config.json must hold a JSON object")
    return data, path
