"""Builders for the TRL oracle: a character-level HF tokenizer and a tiny transformers Mistral, plus a real
`trl.DPOTrainer` over them. Only imported by `oracle` tests and bench/dpo_step.py (the libraries are the oracle
extra); every import of transformers/trl/tokenizers/datasets happens inside these functions."""

from __future__ import annotations

import string

CHARS = string.ascii_letters + string.digits + " +-*=?.,:"
SPECIALS = ["<pad>", "<s>", "</s>"]


def char_tokenizer():
    """A PreTrainedTokenizerFast with one token per character: text lengths map exactly to token counts."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + list(CHARS))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


def tiny_hf_mistral(vocab_size: int = 80, hidden: int = 32, layers: int = 2, heads: int = 4, kv_heads: int = 2,
                    ffn: int = 64, seed: int = 0, dtype=None):
    import torch
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(seed)
    cfg = MistralConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads,
                        max_position_embeddings=1024, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1,
                        eos_token_id=2, attn_implementation="eager")
    model = MistralForCausalLM(cfg)
    if dtype is not None:
        model = model.to(dtype)
    return model


def preference_texts(n: int, prompt_chars: int | None = None, completion_chars: int | None = None, seed: int = 0):
    """`n` prompt/chosen/rejected text triples (arithmetic); fixed character counts when asked (for the bench)."""
    import random

    rng = random.Random(seed)
    rows = {"prompt": [], "chosen": [], "rejected": []}
    for _ in range(n):
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        prompt, chosen, rejected = f"What is {a}+{b}? ", f"It is {a + b}.", f"It is {a + b + rng.randint(1, 9)}."
        if prompt_chars is not None:
            prompt = (prompt * (prompt_chars // len(prompt) + 1))[:prompt_chars]
        if completion_chars is not None:
            # one char is left for the EOS TRL appends
            chosen = (chosen * completion_chars)[: completion_chars - 1]
            rejected = (rejected * completion_chars)[: completion_chars - 1]
        rows["prompt"].append(prompt)
        rows["chosen"].append(chosen)
        rows["rejected"].append(rejected)
    return rows


def dpo_trainer(model, ref_model, rows: dict, out_dir: str, batch_size: int, **dpo_args):
    """A real trl.DPOTrainer on CPU, no logging, no gradient checkpointing (it does not change values)."""
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    args = DPOConfig(output_dir=out_dir, per_device_train_batch_size=batch_size, report_to="none", use_cpu=True,
                     gradient_checkpointing=False, max_length=None, logging_strategy="no", save_strategy="no",
                     dataloader_num_workers=0, seed=0, **dpo_args)
    return DPOTrainer(model=model, ref_model=ref_model, args=args, train_dataset=Dataset.from_dict(rows),
                      processing_class=char_tokenizer())
