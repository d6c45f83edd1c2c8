"""Llama, Qwen 2 and Qwen 3 models: the Mistral decoder (align.model.mistral) under each family's transformers
architecture names. The layers are the same classes; what differs is read from the config (align.model.dense_configs:
scaled RoPE, q/k/v biases, per-head QK-norm), so these classes only name the checkpoint's `architectures` entry and
let the family registry (align.model.family) tell the families apart by class.

Each family has the three heads the stages use: the causal LM (policy / reference), `...ForSequenceClassification`
(`score`, no bias: the reward model and PPO's critic) and `...ForTokenClassification` (`score` with bias: the process
reward model), in transformers' layouts, so their checkpoints load there too.
"""

from __future__ import annotations

from align.model.mistral import MistralForCausalLM, MistralForProcessReward, MistralForValueHead


class LlamaForCausalLM(MistralForCausalLM):
    hf_architecture = "LlamaForCausalLM"


class LlamaForValueHead(MistralForValueHead):
    hf_architecture = "LlamaForSequenceClassification"


class LlamaForProcessReward(MistralForProcessReward):
    hf_architecture = "LlamaForTokenClassification"


class Qwen2ForCausalLM(MistralForCausalLM):
    hf_architecture = "Qwen2ForCausalLM"


class Qwen2ForValueHead(MistralForValueHead):
    hf_architecture = "Qwen2ForSequenceClassification"


class Qwen2ForProcessReward(MistralForProcessReward):
    hf_architecture = "Qwen2ForTokenClassification"


class Qwen3ForCausalLM(MistralForCausalLM):
    hf_architecture = "Qwen3ForCausalLM"


class Qwen3ForValueHead(MistralForValueHead):
    hf_architecture = "Qwen3ForSequenceClassification"


class Qwen3ForProcessReward(MistralForProcessReward):
    hf_architecture = "Qwen3ForTokenClassification"
