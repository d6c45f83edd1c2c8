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
from collections.abc import Callable
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

    # Architecture options of the shared decoder (align.model.mistral) that Mistral does not use: properties, not
    # fields, so Mistral's config.json, dataclass and content hash stay what they were. A family's config
    # (align.model.dense_families) overrides them.
    @property
    def qkv_bias(self) -> bool:
        """Whether q_proj, k_proj and v_proj carry a bias (Qwen 2)."""
        return False

    @property
    def qk_norm(self) -> str | None:
        """None, or "head": an RMSNorm over each head's q and k (weight (head_dim,), Qwen 3) before RoPE."""
        return None

    @property
    def rope_scaling(self) -> "RopeScaling | None":
        """A scaled RoPE's parameters (Llama 3), None for plain RoPE."""
        return None


@dataclass(frozen=True)
class RopeScaling:
    """`rope_type` "llama3": the inverse frequencies of long wavelengths divided by `factor`, a smooth blend between
    the two wavelength bounds (transformers' `_compute_llama3_parameters`, align.model.layers.rope_inv_freq)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int
    rope_type: str = "llama3"

    def __post_init__(self):
        if self.rope_type != "llama3":
            raise ValueError(f"RopeScaling: rope_type {self.rope_type!r} is not implemented (only 'llama3')")
        if not (self.factor > 0 and self.high_freq_factor > self.low_freq_factor > 0
                and self.original_max_position_embeddings > 0):
            raise ValueError(f"RopeScaling: needs factor > 0, high_freq_factor > low_freq_factor > 0 and "
                             f"original_max_position_embeddings > 0, got {self}")

    def hf_dict(self) -> dict:
        """The keys transformers writes in `rope_scaling` / `rope_parameters` for this type."""
        return {"rope_type": self.rope_type, "factor": self.factor, "low_freq_factor": self.low_freq_factor,
                "high_freq_factor": self.high_freq_factor,
                "original_max_position_embeddings": self.original_max_position_embeddings}


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
    rope_types: tuple = ("default",)  # the `rope_type`s this family implements ("llama3": a `rope_scaling` field)
    # (parsed config.json, source) -> the dict the generic reader maps: a family's own refusals by field name and
    # the keys transformers itself drops (Qwen's `sliding_window` when `use_sliding_window` is false)
    prepare: Callable[[dict, str], dict] | None = None


MISTRAL_SPEC = ConfigSpec(MistralConfig, "mistral", HF_DEFAULTS, IGNORED_KEYS, REQUIRED_VALUES,
                          written={"hidden_act": "silu", "attention_dropout": 0.0})


def config_from_hf_dict(data: dict, source: str = "<dict>", spec: ConfigSpec = MISTRAL_SPEC):
    """Map a parsed `config.json` onto the family's config, refusing anything the model does not implement."""
    if data.get("model_type", spec.model_type) != spec.model_type:
        raise CheckpointError(f"{source}: model_type is {data['model_type']!r}; this reader implements "
                              f"{spec.model_type!r}")
    data = {spec.aliases.get(k, k): v for k, v in data.items()}
    if spec.prepare is not None:
        data = spec.prepare(data, source)
    for key, allowed in spec.required.items():
        if key in data and data[key] not in allowed:
            raise CheckpointError(f"{source}: field {key!r} = {data[key]!r} is not implemented "
                                  f"(supported: {', '.join(repr(a) for a in allowed)})")
    fields = {f.name for f in dataclasses.fields(spec.cls)}
    rope_keys = {"rope_theta", "rope_scaling"}
    values = {k: data.get(k, spec.defaults[k]) for k in fields - rope_keys}
    values["rope_theta"], scaling = _rope(data, source, spec)
    if "rope_scaling" in fields:
        values["rope_scaling"] = scaling
    unknown = sorted(set(data) - fields - spec.ignored - set(spec.required) - {"rope_parameters", "rope_scaling"})
    if unknown:
        raise CheckpointError(f"{source}: unsupported field(s) {unknown}; refusing to guess their effect")
    if values["num_key_value_heads"] is None:
        values["num_key_value_heads"] = values["num_attention_heads"]
    if isinstance(values["eos_token_id"], list):
        if not _allows_tuple(spec.cls, "eos_token_id"):
            raise CheckpointError(f"{source}: field 'eos_token_id' is a list {values['eos_token_id']}; one id "
                                  "expected")
        values["eos_token_id"] = tuple(values["eos_token_id"])
    _check_types(values, source, spec.cls)
    try:
        return spec.cls(**values)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{source}: {exc}") from exc


def _rope(data: dict, source: str, spec: ConfigSpec) -> tuple[float, RopeScaling | None]:
    """(rope_theta, scaling) from either spelling: top-level `rope_theta` + `rope_scaling` (transformers 4, the
    hub's files) or `rope_parameters` (transformers 5). A rope_type the family does not implement is refused."""
    theta = data.get("rope_theta", spec.defaults["rope_theta"])
    params, field = data.get("rope_parameters"), "rope_parameters"
    if params is None:
        params, field = data.get("rope_scaling"), "rope_scaling"
    if params is None:
        return float(theta), None
    if not isinstance(params, dict):
        raise CheckpointError(f"{source}: field {field!r} must be an object, got {params!r}")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in spec.rope_types:
        raise CheckpointError(f"{source}: field '{field}.rope_type' = {rope_type!r} is not implemented "
                              f"(supported: {', '.join(repr(t) for t in spec.rope_types)})")
    theta = float(params.get("rope_theta", theta))
    keys = {"rope_type", "type", "rope_theta"}
    if rope_type == "llama3":
        keys |= {f.name for f in dataclasses.fields(RopeScaling)}
    extra = sorted(set(params) - keys)
    if extra:
        raise CheckpointError(f"{source}: field {field!r} has unsupported keys {extra}")
    if rope_type == "default":
        return theta, None
    missing = sorted({"factor", "low_freq_factor", "high_freq_factor"} - set(params))
    if missing:
        raise CheckpointError(f"{source}: field '{field}' (rope_type {rope_type!r}) lacks {missing}")
    original = params.get("original_max_position_embeddings",
                          data.get("max_position_embeddings", spec.defaults["max_position_embeddings"]))
    try:  # transformers falls back to max_position_embeddings for a missing original length
        return theta, RopeScaling(float(params["factor"]), float(params["low_freq_factor"]),
                                  float(params["high_freq_factor"]), int(original))
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{source}: field '{field}': {exc}") from exc


def _allows_tuple(cls: type, name: str) -> bool:
    return any(f.name == name and "tuple" in str(f.type) for f in dataclasses.fields(cls))


def _check_types(values: dict, source: str, cls: type) -> None:
    for f in dataclasses.fields(cls):
        v = values[f.name]
        optional = "None" in str(f.type)
        if v is None and optional or isinstance(v, RopeScaling):
            continue
        if isinstance(v, tuple) and "tuple" in str(f.type):
            if not v or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
                raise CheckpointError(f"{source}: field {f.name!r} = {list(v)!r}; expected integer ids")
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
