"""The configs of the dense families beyond Mistral (Llama 3.x, Qwen 2 / 2.5, Qwen 3) and how their `config.json`
maps onto them (a `ConfigSpec` each, registered in align.model.family).

All three are the Mistral decoder (align.model.mistral) with at most one option switched on, so each config is
`MistralConfig` plus the properties the shared attention reads: Llama 3 a scaled RoPE (`rope_scaling`, rope_type
"llama3"), Qwen 2 biases on q/k/v (`qkv_bias`), Qwen 3 a per-head q/k RMSNorm (`qk_norm` "head", with its explicit
`head_dim`). What none of them implements is refused by field name when the file is read: other rope types, sliding
windows (`use_sliding_window`, `layer_types`, a Llama `sliding_window`), biases where the family has none
(`attention_bias`, `mlp_bias`), M-RoPE. Defaults for omitted keys are transformers' own for each family. All three
accept a list `eos_token_id` (Llama 3.x Instruct ships three), kept as a tuple.
"""

from __future__ import annotations

from dataclasses import dataclass

from align.exceptions import CheckpointError
from align.model.hf_config import IGNORED_KEYS, ConfigSpec, MistralConfig, RopeScaling


def _only_full_attention(cfg: MistralConfig, family: str) -> list[str]:
    if cfg.sliding_window is not None:
        return [f"sliding_window must be None for {family} (sliding-window attention is not implemented), "
                f"got {cfg.sliding_window}"]
    return []


def _refuse(problems: list[str], name: str) -> None:
    if problems:
        raise ValueError(f"{name}: " + "; ".join(problems))


@dataclass(frozen=True)
class LlamaConfig(MistralConfig):
    """Llama 3.x: GQA, RoPE scaled by `rope_scaling` (None: plain RoPE), tied embeddings in the 1B / 3B models."""

    vocab_size: int = 128256
    rope_theta: float = 500_000.0
    bos_token_id: int | None = 128000
    eos_token_id: int | tuple[int, ...] | None = 128001
    rope_scaling: RopeScaling | None = None

    def __post_init__(self):
        super().__post_init__()
        _refuse(_only_full_attention(self, "Llama"), "LlamaConfig")


@dataclass(frozen=True)
class Qwen2Config(MistralConfig):
    """Qwen 2 / 2.5: biases on q, k and v; head_dim is hidden_size / num_attention_heads (transformers' Qwen2
    config has no head_dim of its own)."""

    vocab_size: int = 151936
    bos_token_id: int | None = 151643
    eos_token_id: int | tuple[int, ...] | None = 151643
    rms_norm_eps: float = 1e-6

    def __post_init__(self):
        super().__post_init__()
        problems = _only_full_attention(self, "Qwen2")
        if self.head_dim * self.num_attention_heads != self.hidden_size:
            problems.append(f"head_dim ({self.head_dim}) x num_attention_heads ({self.num_attention_heads}) must "
                            f"equal hidden_size ({self.hidden_size})")
        _refuse(problems, "Qwen2Config")

    @property
    def qkv_bias(self) -> bool:
        return True


@dataclass(frozen=True)
class Qwen3Config(MistralConfig):
    """Qwen 3 (dense): per-head RMSNorm on q and k before RoPE, an explicit head_dim (128 in the released models,
    not hidden_size / heads), no biases."""

    vocab_size: int = 151936
    bos_token_id: int | None = 151643
    eos_token_id: int | tuple[int, ...] | None = 151645
    rms_norm_eps: float = 1e-6

    def __post_init__(self):
        super().__post_init__()
        _refuse(_only_full_attention(self, "Qwen3"), "Qwen3Config")

    @property
    def qk_norm(self) -> str | None:
        return "head"


def _llama_prepare(data: dict, source: str) -> dict:
    if data.get("sliding_window") is not None:
        raise CheckpointError(f"{source}: field 'sliding_window' = {data['sliding_window']!r} is not implemented "
                              "for llama (full causal attention only)")
    return data


def _qwen_prepare(data: dict, source: str) -> dict:
    """Qwen writes `sliding_window` (and `max_window_layers`) even with the window off; transformers then sets the
    window to None, and so does this reader. A window that is on, in any spelling, is refused by name."""
    if data.get("use_sliding_window", False) is not False:
        raise CheckpointError(f"{source}: field 'use_sliding_window' = {data['use_sliding_window']!r} is not "
                              "implemented (sliding-window attention; supported: False)")
    kinds = data.get("layer_types")
    if kinds is not None and (not isinstance(kinds, list) or any(k != "full_attention" for k in kinds)):
        raise CheckpointError(f"{source}: field 'layer_types' = {kinds!r} is not implemented (only "
                              "'full_attention' layers)")
    drop = {"use_sliding_window", "sliding_window", "max_window_layers", "layer_types"}
    return {k: v for k, v in data.items() if k not in drop}


LLAMA_HF_DEFAULTS = {
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": None, "head_dim": None, "max_position_embeddings": 2048,
    "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "sliding_window": None,
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": None, "initializer_range": 0.02,
}
QWEN2_HF_DEFAULTS = {
    "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": None, "max_position_embeddings": 32768,
    "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "sliding_window": None,
    "bos_token_id": None, "eos_token_id": None, "pad_token_id": None, "initializer_range": 0.02,
}
QWEN3_HF_DEFAULTS = {**QWEN2_HF_DEFAULTS, "head_dim": 128}

_DENSE_REQUIRED = {"hidden_act": ("silu",), "attention_dropout": (0, 0.0), "quantization_config": (None,)}
LLAMA_SPEC = ConfigSpec(
    LlamaConfig, "llama", LLAMA_HF_DEFAULTS, IGNORED_KEYS,
    {**_DENSE_REQUIRED, "attention_bias": (False,), "mlp_bias": (False,), "pretraining_tp": (1, None)},
    written={"hidden_act": "silu", "attention_dropout": 0.0, "attention_bias": False, "mlp_bias": False,
             "pretraining_tp": 1},
    not_written=("sliding_window",), rope_types=("default", "llama3"), prepare=_llama_prepare)
QWEN2_SPEC = ConfigSpec(
    Qwen2Config, "qwen2", QWEN2_HF_DEFAULTS, IGNORED_KEYS, {**_DENSE_REQUIRED, "use_mrope": (False,)},
    written={"hidden_act": "silu", "attention_dropout": 0.0, "use_sliding_window": False},
    not_written=("head_dim",), prepare=_qwen_prepare)
QWEN3_SPEC = ConfigSpec(
    Qwen3Config, "qwen3", QWEN3_HF_DEFAULTS, IGNORED_KEYS, {**_DENSE_REQUIRED, "attention_bias": (False,)},
    written={"hidden_act": "silu", "attention_dropout": 0.0, "attention_bias": False, "use_sliding_window": False},
    prepare=_qwen_prepare)
