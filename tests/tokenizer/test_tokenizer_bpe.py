"""The merge loop (scan and heap agree with a direct transcription of tokenizers' rule), the word cache bound,
long inputs, and the regex translator."""

from __future__ import annotations

import random
import re

import pytest

from align.tokenizer import BpeCacheConfig, Tokenizer
from align.tokenizer.bpe_merge import build_table, merge_heap, merge_scan
from align.tokenizer.unicode_regex import translate


def reference_merge(symbols: list[str], ranks: dict) -> list[str]:
    """tokenizers' order, written the slow obvious way: lowest (rank, position) adjacent pair first."""
    symbols = list(symbols)
    while True:
        candidates = [(ranks[(a, b)], i) for i, (a, b) in enumerate(zip(symbols, symbols[1:])) if (a, b) in ranks]
        if not candidates:
            return symbols
        _, i = min(candidates)
        symbols[i:i + 2] = [symbols[i] + symbols[i + 1]]


def random_merges(rng: random.Random, alphabet: str, n: int) -> dict:
    pieces = list(alphabet)
    ranks: dict = {}
    while len(ranks) < n:
        a, b = rng.choice(pieces), rng.choice(pieces)
        if (a, b) not in ranks and len(a + b) <= 6:
            ranks[(a, b)] = len(ranks)
            pieces.append(a + b)
    # shuffle ranks so later pieces can outrank their parts (the case a naive "merge all occurrences" gets wrong)
    values = list(ranks.values())
    rng.shuffle(values)
    return dict(zip(ranks, values))


@pytest.mark.parametrize("seed", range(6))
def test_scan_and_heap_agree_with_reference(seed):
    rng = random.Random(seed)
    ranks = random_merges(rng, "abc", 40)
    merges = [pair for pair, _ in sorted(ranks.items(), key=lambda kv: kv[1])]
    vocab = {p: i for i, p in enumerate(sorted({*"abc", *(a + b for a, b in merges)}))}
    table = build_table([(vocab[a], vocab[b], vocab[a + b]) for a, b in merges])
    for _ in range(300):
        word = [rng.choice("abc") for _ in range(rng.randint(0, 40))]
        expected = [vocab[p] for p in reference_merge(word, ranks)]
        assert merge_scan([vocab[c] for c in word], table) == expected
        assert merge_heap([vocab[c] for c in word], table) == expected


def test_cache_is_bounded_and_skips_long_words():
    tok = Tokenizer.from_pretrained(cache=BpeCacheConfig(max_entries=50, max_word_chars=20))
    rng = random.Random(0)
    for _ in range(30):
        tok.encode(" ".join("".join(rng.choice("abcdefgh") for _ in range(5)) for _ in range(20)))
        assert tok.cache_size() <= 50
    before = tok.cache_size()
    tok.encode("x" * 1000)
    assert tok.cache_size() <= before + 1  # the 1000-char word itself is not cached


def test_long_inputs_encode_exactly_like_short_pieces():
    tok = Tokenizer.from_pretrained()
    letters = "".join(random.Random(1).choice("abcdefghij") for _ in range(10_000))
    ids = tok.encode(letters)  # one 10,000-character word: the heap path
    assert tok.decode(ids) == letters
    spaces = tok.encode(" " * 10_000)
    assert tok.decode(spaces) == " " * 10_000 and len(spaces) < 1_000


def test_translate_expands_properties_and_white_space():
    pattern = re.compile(translate(r"\p{L}+|\p{N}+|\s+|[^\s\p{L}\p{N}]+"))
    assert pattern.findall("héllo 42\x1c日本") == ["héllo", " ", "42", "\x1c", "日本"]  # \x1c is not White_Space
    assert re.fullmatch(translate(r"\S+"), "\x1f\x1e")
    assert not re.fullmatch(translate(r"\s"), "\x1c")
    assert re.fullmatch(translate(r"[\p{Lu}]+"), "ÀB") and not re.fullmatch(translate(r"\p{Lu}"), "b")


@pytest.mark.parametrize("pattern", [r"\w+", r"\bx", r"[\S]", r"[a[b]]", r"\p{Han}", r"\x{41}", r"[a&&b]"])
def test_translate_refuses_what_it_cannot_do_exactly(pattern):
    with pytest.raises(NotImplementedError):
        translate(pattern)


@pytest.mark.oracle
@pytest.mark.parametrize("alphabet, n_merges", [("abc", 60), ("abcdefgh", 30)])
def test_merge_order_matches_tokenizers_on_adversarial_ranks(tmp_path, alphabet, n_merges):
    """Ranks shuffled so a piece can outrank its parts and one piece has several splits: tokenizers' heap with
    stale entries must give exactly what our loops give (short words take the scan, long ones the heap). With a
    sparse merge table many character pairs are exact cut points, and the unknown characters Q, R (fused into one
    <unk>) must stay attached to their neighbours."""
    tokenizers = pytest.importorskip("tokenizers")
    rng = random.Random(11)
    ranks = random_merges(rng, alphabet, n_merges)
    merges = [pair for pair, _ in sorted(ranks.items(), key=lambda kv: kv[1])]
    pieces = sorted({*alphabet, *(a + b for a, b in merges)}, key=lambda p: (len(p), p))
    vocab = {"<unk>": 0, **{p: i + 1 for i, p in enumerate(pieces)}}
    hf = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True))
    hf.save(str(tmp_path / "tokenizer.json"))
    ours = Tokenizer.from_pretrained(str(tmp_path))
    letters = alphabet + "QR"
    for _ in range(400):
        word = "".join(rng.choice(letters) for _ in range(rng.choice([rng.randint(1, 30), rng.randint(200, 600)])))
        assert ours.encode(word) == hf.encode(word, add_special_tokens=False).ids, word
