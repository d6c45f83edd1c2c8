"""Byte-level BPE parity (oracle tier): tokenizer.json files trained here with `tokenizers` on a synthetic corpus,
in the layouts GPT-2/OLMo (ByteLevel pre-tokenizer with its regex) and Llama-3 (Split regex + ByteLevel without
regex, ignore_merges, a BOS template), then encode/decode compared with `tokenizers` on the whole test corpus."""

from __future__ import annotations

import random

import pytest

from align.tokenizer import Tokenizer
from byte_level_layouts import LLAMA3_PATTERN, check_ids, training_text
from tok_corpus import build_corpus

pytestmark = pytest.mark.oracle
tokenizers = pytest.importorskip("tokenizers")
from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402

CORPUS = build_corpus()
SPECIALS = ["<|endoftext|>", "<|begin_of_text|>", "<|pad|>"]


def _train(tok, ignore_merges: bool):
    trainer = trainers.BpeTrainer(vocab_size=1500, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(training_text(chat_lines=False), trainer=trainer)
    if ignore_merges:  # the trainer builds a plain model; Llama-3's tokenizer.json sets ignore_merges
        state = tok.to_str()
        tok = tokenizers.Tokenizer.from_str(state.replace('"ignore_merges":false', '"ignore_merges":true'))
        assert '"ignore_merges":true' in tok.to_str()
    return tok


def gpt2_style(add_prefix_space: bool):
    tok = tokenizers.Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    tok = _train(tok, ignore_merges=False)
    # OLMo-style non-special added tokens, matched on the normalized text
    tok.add_tokens([AddedToken("|||EMAIL_ADDRESS|||", normalized=True), AddedToken("|||PHONE|||", normalized=True)])
    return tok


def llama3_style():
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(tokenizers.Regex(LLAMA3_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok = _train(tok, ignore_merges=True)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                       special_tokens=[("<|begin_of_text|>", bos)])
    return tok


@pytest.fixture(scope="module", params=["gpt2", "gpt2_prefix_space", "llama3"])
def pair(request, tmp_path_factory):
    hf = {"gpt2": lambda: gpt2_style(False), "gpt2_prefix_space": lambda: gpt2_style(True),
          "llama3": llama3_style}[request.param]()
    directory = tmp_path_factory.mktemp(request.param)
    hf.save(str(directory / "tokenizer.json"))
    return Tokenizer.from_pretrained(str(directory)), hf, request.param == "gpt2_prefix_space"


EXTRA = ["|||EMAIL_ADDRESS|||", "mail me at |||EMAIL_ADDRESS||| or |||PHONE|||", "<|endoftext|>x<|pad|>",
         "it's IT'S It'S we'LL 'd ſ K", "12345678901 x1y22z333", "\r\n\r\n  \n\t\x1c\x1d x\x1f\x85y\u00a0z"]


def test_encode_matches_tokenizers(pair):
    ours, hf, prefix_space = pair
    check_ids(ours, hf, CORPUS + EXTRA)

def test_pre_tokenizer_pieces_match_tokenizers(pair):
    """Finer than ids: the regex split itself (\\s is Unicode White_Space, not str.isspace; \\p{L} classes)."""
    ours, hf, _ = pair
    for text in CORPUS + EXTRA:
        normalized = hf.normalizer.normalize_str(text) if hf.normalizer is not None else text
        expected = [piece for piece, _ in hf.pre_tokenizer.pre_tokenize_str(normalized)]
        assert ours.pre_tokenize(text) == expected, text[:50]


def test_decode_matches_tokenizers_and_round_trips(pair):
    ours, hf, prefix_space = pair
    for text in CORPUS + EXTRA:
        ids = ours.encode(text, add_special_tokens=True, parse_special=True)
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip), text[:50]
        if not prefix_space:  # add_prefix_space adds a space to each segment by design: not lossless
            # lossless up to the NFC normalizer of the gpt2 layout
            expected = hf.normalizer.normalize_str(text) if hf.normalizer is not None else text
            assert ours.decode(ours.encode(text)) == expected, text[:50]


def test_decode_of_arbitrary_ids_matches_tokenizers(pair):
    ours, hf, prefix_space = pair
    rng = random.Random(5)
    for _ in range(300):  # random byte tokens: invalid UTF-8 runs included
        ids = [rng.randrange(ours.vocab_size) for _ in range(rng.randint(1, 16))]
        assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=False), ids
