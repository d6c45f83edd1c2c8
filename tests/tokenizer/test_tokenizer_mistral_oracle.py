"""Parity of align.tokenizer on the vendored Mistral v0.3 files with sentencepiece and tokenizers (oracle tier).

Which reference applies to which mode (FACTS.md: the two disagree on literal special-token text):
- parse_special=False: sentencepiece on tokenizer.model.v3 (ground truth) for every text; tokenizers with
  `encode_special_tokens=True` for every text except one tokenizers quirk, pinned below.
- parse_special=True: tokenizers' default encode (special-token text becomes the control id).
"""

from __future__ import annotations

import random
import re

import pytest

from align.tokenizer import Tokenizer
from align.tokenizer.tokenizer import VENDORED_DIR
from tok_corpus import build_corpus

pytestmark = pytest.mark.oracle
spm = pytest.importorskip("sentencepiece")
tokenizers = pytest.importorskip("tokenizers")

CORPUS = build_corpus()


@pytest.fixture(scope="module")
def ours() -> Tokenizer:
    return Tokenizer.from_pretrained()


@pytest.fixture(scope="module")
def sp():
    return spm.SentencePieceProcessor(model_file=str(VENDORED_DIR / "tokenizer.model.v3"))


@pytest.fixture(scope="module")
def hf():
    return tokenizers.Tokenizer.from_file(str(VENDORED_DIR / "tokenizer.json"))


def _mismatches(pairs):
    return [(text[:60], a[:12], b[:12]) for text, a, b in pairs if a != b]


def test_corpus_is_large_enough():
    assert len(CORPUS) >= 400
    assert "" in CORPUS and max(map(len, CORPUS)) >= 10_000


def test_encode_matches_sentencepiece(ours, sp):
    bad = _mismatches((t, ours.encode(t), sp.encode(t)) for t in CORPUS)
    assert not bad, f"{len(bad)} texts differ from sentencepiece, first: {bad[:3]}"


def test_encode_with_bos_matches_sentencepiece(ours, sp):
    bad = _mismatches((t, ours.encode(t, add_special_tokens=True), sp.encode(t, add_bos=True)) for t in CORPUS)
    assert not bad, bad[:3]


def _special_pretoken_quirk(ours: Tokenizer, text: str) -> bool:
    """tokenizers' ignore_merges looks a whole pre-token up in the vocab, control tokens included: a literal
    `[INST]` cut out as its own pre-token (right after a `[REFERENCE_DOC_n]`) becomes id 3 even with
    encode_special_tokens=True. align never lets plain text produce a control id (and matches sentencepiece)."""
    specials = "|".join(re.escape(ours.id_to_token(i)) for i in range(ours.vocab_size) if ours.is_special(i))
    return re.search(rf"\[REFERENCE_DOC_\d+\](?:{specials})(?=\[REFERENCE_DOC_\d+\]|$)", text) is not None


def test_plain_mode_matches_tokenizers_encode_special_tokens(ours, hf):
    hf.encode_special_tokens = True
    try:
        pairs = [(t, ours.encode(t), hf.encode(t, add_special_tokens=False).ids) for t in CORPUS]
    finally:
        hf.encode_special_tokens = False
    bad = [(t, a, b) for t, a, b in pairs if a != b]
    unexplained = [row for row in bad if not _special_pretoken_quirk(ours, row[0])]
    assert not unexplained, _mismatches(unexplained)[:3]
    # the quirk is real (so the exemption above is not dead code) and ours equals sentencepiece there
    assert any(t == "[REFERENCE_DOC_1][INST]" for t, _, _ in bad)


def test_parse_special_matches_tokenizers(ours, hf):
    bad = _mismatches((t, ours.encode(t, parse_special=True), hf.encode(t, add_special_tokens=False).ids)
                      for t in CORPUS)
    assert not bad, bad[:3]
    bad = _mismatches((t, ours.encode(t, add_special_tokens=True, parse_special=True), hf.encode(t).ids)
                      for t in CORPUS)
    assert not bad, bad[:3]


def test_normalizer_and_pre_tokenizer_match_tokenizers(ours, hf):
    for text in CORPUS:
        normalized = hf.normalizer.normalize_str(text)
        assert ours.pre_tokenize(text) == [p for p, _ in hf.pre_tokenizer.pre_tokenize_str(normalized)], text[:60]


def test_plain_mode_never_yields_a_control_id(ours):
    for text in CORPUS:
        assert not any(ours.is_special(i) for i in ours.encode(text)), text[:60]
    assert ours.encode("[INST]", parse_special=True) == [3]
    assert 3 not in ours.encode("[INST]")


def test_decode_matches_both_references(ours, sp, hf):
    for text in CORPUS:
        for parse_special in (False, True):
            ids = ours.encode(text, add_special_tokens=True, parse_special=parse_special)
            for skip in (False, True):
                assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip), text[:60]
        ids = ours.encode(text, add_special_tokens=True)
        assert ours.decode(ids, skip_special_tokens=True) == sp.decode(ids), text[:60]


def test_round_trip_on_corpus(ours):
    for text in CORPUS:
        # U+2581 is sentencepiece's space mark: the model cannot tell it from a space (both references agree)
        assert ours.decode(ours.encode(text)) == text.replace("\u2581", " "), text[:60]


def test_decode_of_arbitrary_ids_matches_tokenizers(ours, hf):
    """Ids no encoder would produce: invalid UTF-8 byte runs, control tokens mid-word, <unk>."""
    rng = random.Random(3)
    pools = [range(0, 1100), range(771, 1027), range(0, ours.vocab_size)]
    for n in range(300):
        pool = pools[n % len(pools)]
        ids = [rng.choice(pool) for _ in range(rng.randint(1, 24))]
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip), ids
