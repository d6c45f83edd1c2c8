"""The model families align implements, keyed by `config.json`'s `model_type` (never guessed from key names).

A `Family` says which config reader/writer, which model classes, and which weight layout on disk go together.
Checkpoint code (align.model.checkpoint, align.train.ckpt_format) asks the registry instead of branching on a
family, so a new family enters here and nowhere else.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch

from align.exceptions import CheckpointError
from align.model.dense_configs import LLAMA_SPEC, QWEN2_SPEC, QWEN3_SPEC
from align.model.dense_families import (LlamaForCausalLM, LlamaForProcessReward, LlamaForValueHead,
                                        Qwen2ForCausalLM, Qwen2ForProcessReward, Qwen2ForValueHead, Qwen3ForCausalLM,
                                        Qwen3ForProcessReward, Qwen3ForValueHead)
from align.model.hf_config import MISTRAL_SPEC, ConfigSpec
from align.model.mistral import MistralForCausalLM, MistralForProcessReward, MistralForValueHead
from align.model.hf_config import MistralConfig
from align.model.olmoe import ExpertLayout, OlmoeForCausalLM, olmoe_from_layout
from align.model.olmoe_checkpoint import OLMOE_SPEC, fuse_hub_pairs, hub_targets, to_hub_layout

StateDict = dict[str, torch.Tensor]
MLP_KINDS = ("dense", "sparse")  # `Family.mlp`: what follows attention in a decoder layer
Pairs = Iterable[tuple[str, torch.Tensor]]


def _same(x):
    return x


def _pairs_unchanged(pairs: Pairs, cfg) -> Iterator[tuple[str, torch.Tensor]]:
    return iter(pairs)


@dataclass(frozen=True)
class Family:
    name: str  # = config.json's model_type
    spec: ConfigSpec
    models: tuple[type, ...]  # the first is the causal LM load_checkpoint builds by default
    to_file: Callable[[StateDict], StateDict]  # model-layout state -> the file's keys
    file_targets: Callable[[StateDict], StateDict]  # model parameters -> {file key: tensor to fill}
    from_file: Callable[[Pairs, object], Iterator[tuple[str, torch.Tensor]]]  # (file pairs, config) -> model layout
    vendored_tokenizer: bool  # may fall back to the vendored Mistral v0.3 tokenizer when a snapshot has none
    # the block after attention: "dense" (SwiGLU MLP) | "sparse" (routed experts); the engine's decode step picks
    # its block by this (align.inference.fused_layers), so a new dense family registers here and nowhere else
    mlp: str = "dense"

    def __post_init__(self):
        if self.mlp not in MLP_KINDS:
            raise ValueError(f"family {self.name!r}: mlp is {self.mlp!r}; one of {MLP_KINDS}")

    @property
    def causal_lm(self) -> type:
        return self.models[0]

    @property
    def architectures(self) -> dict[str, type]:
        return {cls.hf_architecture: cls for cls in self.models}

    def model_like(self, cls: type) -> type:
        """This family's model with the role of `cls` (any family's model): the same head, named by the part of
        the architecture after the family's prefix ("ForSequenceClassification", ...). `cls` itself if it is one
        of this family's, so a stage naming Mistral's critic class loads a Qwen critic checkpoint too."""
        if cls in self.models:
            return cls
        role = cls.hf_architecture[cls.hf_architecture.find("For"):]
        for model in self.models:
            if model.hf_architecture.endswith(role):
                return model
        raise CheckpointError(f"the {self.name} family has no *{role} model (models: "
                              f"{[m.__name__ for m in self.models]})")


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("mistral", MISTRAL_SPEC, (MistralForCausalLM, MistralForValueHead, MistralForProcessReward),
           _same, _same, _pairs_unchanged, vendored_tokenizer=True),
    # the hub's own layouts: the state dict is the file (a tied lm_head is left out, as transformers writes it)
    Family("llama", LLAMA_SPEC, (LlamaForCausalLM, LlamaForValueHead, LlamaForProcessReward),
           _same, _same, _pairs_unchanged, vendored_tokenizer=False),
    Family("qwen2", QWEN2_SPEC, (Qwen2ForCausalLM, Qwen2ForValueHead, Qwen2ForProcessReward),
           _same, _same, _pairs_unchanged, vendored_tokenizer=False),
    Family("qwen3", QWEN3_SPEC, (Qwen3ForCausalLM, Qwen3ForValueHead, Qwen3ForProcessReward),
           _same, _same, _pairs_unchanged, vendored_tokenizer=False),
    # OLMoE ships its own 50304-token tokenizer: a checkpoint without tokenizer.json has no tokenizer
    Family("olmoe", OLMOE_SPEC, (OlmoeForCausalLM,), to_hub_layout, hub_targets, fuse_hub_pairs,
           vendored_tokenizer=False, mlp="sparse"),
)}


def family_named(model_type: str, source: str = "<config>") -> Family:
    if model_type not in FAMILIES:
        raise CheckpointError(f"{source}: model_type is {model_type!r}; align implements {sorted(FAMILIES)}")
    return FAMILIES[model_type]


def family_of_config_dict(data: dict, source: str = "<config>") -> Family:
    """The family a parsed config.json names (a file without model_type is read as Mistral, as before)."""
    return family_named(data.get("model_type", "mistral"), source)


def family_of_config(cfg) -> Family:
    """The family whose config class `cfg` is exactly (OlmoeConfig extends MistralConfig: exact type decides)."""
    for family in FAMILIES.values():
        if type(cfg) is family.spec.cls:
            return family
    raise CheckpointError(f"no model family has config class {type(cfg).__name__}")


def family_of_model(model) -> Family:
    """The family of the nearest class in the model's MRO that a family lists: FSDP2's fully_shard swaps a module's
    class for a subclass of it, and a Llama / Qwen model is a subclass of Mistral's (align.model.dense_families)."""
    for cls in type(model).__mro__:
        for family in FAMILIES.values():
            if cls in family.models:
                return family
    raise CheckpointError(f"no model family has model class {type(model).__name__}")


def from_scratch(init: MistralConfig, moe: ExpertLayout | None = None, family: str | None = None):
    """A freshly initialised causal LM of a stage's [model.init] shape; a [model.moe] table makes it OLMoE, a
    dense `family` ("qwen3", "llama", ...) that family's model of the same shape (default: the config's own)."""
    if moe is not None:
        if family not in (None, "olmoe"):
            raise CheckpointError(f"[model.moe] makes an OLMoE model; [model] family = {family!r} contradicts it")
        return olmoe_from_layout(init, moe)
    init = scratch_config(init, family)
    return family_of_config(init).causal_lm(init)


def scratch_config(init: MistralConfig, family: str | None = None) -> MistralConfig:
    """A dense from-scratch model's config: `init`'s shape as `family`'s config class (None: `init` as it is)."""
    if family is None:
        return init
    return family_named(family, "[model] family").spec.cls(**dataclasses.asdict(init))
