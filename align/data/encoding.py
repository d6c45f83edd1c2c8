"""Records to token sequences: the chat template is applied here, once, and the loss mask is built with the ids.

The chat format is the tokenizer directory's own (`Tokenizer.encode_chat` / `encode_prompt`, chosen from its files
by align.tokenizer.chat_format): the Mistral v0.3 `[INST]` encoder for the vendored tokenizers, else the
checkpoint's Jinja `chat_template` rendered as transformers renders it. Each record becomes `seqs_per_row`
sequences of (ids, loss_mask):
- sft: the conversation (mask 1 on assistant output and its end-of-turn token: `</s>`, `<|im_end|>`, `<|eot_id|>`),
  its tool definitions, tool calls and tool results passed to the template as transformers takes them (`tools=`,
  `tool_calls`, `tool` turns); the Mistral v0.3 format refuses them (align.tokenizer.chat).
- pairs: two sequences, prompt + chosen reply and prompt + rejected reply (mask 1 on the reply and its end token).
- prompts: the prompt (with its tools, as sft) and the template's generation prompt (`[/INST]`,
  `<|im_start|>assistant\n`, ...; mask all 0), the gold answer kept as text beside it.

Every render gets the template variable `date_string` from `EncodingConfig.date_string`: Llama 3.x templates write
"Today Date: {date_string}" into the system header, and without it they call `strftime_now`, so the ids would
depend on the day the shards were built. The pin is part of the config, so of the shard build's identity: a
change rebuilds the shards. (Formats that do not read it, Mistral's and Qwen's, encode exactly as without it.)

A sequence longer than `max_len` is dropped (counted) or truncated from the right, per `EncodingConfig.too_long`;
a pair is dropped or kept whole, never with one arm alone."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from align.data.schema import Conversation, OutcomePrompt, PreferencePair, Record, messages_plain, tools_plain

SEQS_PER_ROW = {"sft": 1, "pairs": 2, "prompts": 1}
# the date Llama 3.x templates write when given neither date_string nor a clock (their own fallback)
DEFAULT_DATE_STRING = "26 Jul 2024"


@dataclass(frozen=True)
class EncodingConfig:
    """How records become sequences. `max_len` counts tokens, the template's control tokens included."""

    max_len: int = 512
    too_long: Literal["drop", "truncate"] = "drop"  # truncate keeps the first max_len tokens
    date_string: str = DEFAULT_DATE_STRING  # the template's `date_string` (never the build machine's clock)

    def __post_init__(self):
        if self.max_len < 2:
            raise ValueError(f"max_len must be >= 2, got {self.max_len}")
        if not self.date_string.strip():
            raise ValueError("date_string must be a non-empty date as the template writes it, e.g. \"26 Jul 2024\"")


@dataclass(frozen=True)
class Encoded:
    """One row's sequences: ids and masks, same lengths, `seqs_per_row` of each."""

    ids: tuple[np.ndarray, ...]
    masks: tuple[np.ndarray, ...]
    truncated: bool = False


def _sequences(tokenizer, record: Record, cfg: EncodingConfig) -> list[tuple[list[int], list[int]]]:
    pinned: dict = {"date_string": cfg.date_string}
    tools = tools_plain(record)  # passed only when the record has them (the Mistral format refuses tools)
    if tools is not None:
        pinned["tools"] = tools
    if isinstance(record, Conversation):
        enc = tokenizer.encode_chat(messages_plain(record.messages), **pinned)
        return [(enc.ids, enc.loss_mask)]
    if isinstance(record, PreferencePair):
        out = []
        for reply in (record.chosen, record.rejected):
            enc = tokenizer.encode_chat(messages_plain(record.prompt) + [{"role": "assistant", "content": reply}],
                                        **pinned)
            out.append((enc.ids, enc.loss_mask))
        return out
    if isinstance(record, OutcomePrompt):
        ids = tokenizer.encode_prompt(messages_plain(record.prompt), **pinned)
        return [(ids, [0] * len(ids))]
    raise TypeError(f"not a record: {type(record).__name__}")


def encode_record(tokenizer, record: Record, cfg: EncodingConfig) -> Encoded | None:
    """The row's sequences, or None when a sequence is too long and the policy is to drop it."""
    seqs = _sequences(tokenizer, record, cfg)
    too_long = any(len(ids) > cfg.max_len for ids, _ in seqs)
    if too_long and cfg.too_long == "drop":
        return None
    if too_long:
        seqs = [(ids[:cfg.max_len], mask[:cfg.max_len]) for ids, mask in seqs]
    return Encoded(tuple(np.asarray(ids, dtype=np.int64) for ids, _ in seqs),
                   tuple(np.asarray(mask, dtype=np.uint8) for _, mask in seqs), truncated=too_long)


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned type that holds every id (Mistral's 32,768 ids fit uint16: half the disk and cache)."""
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)
