"""Vocabulary trimming (align.tokenizer.trim): exact on the corpus, total on any text, and a tokenizer directory that
align and (oracle tier) tokenizers / transformers load and encode alike."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from align.exceptions import ArtifactError
from align.tokenizer import Tokenizer
from align.tokenizer import trim as trim_mod
from align.tokenizer.tokenizer import VENDORED_DIR
from align.tokenizer.trim import CHAT_CONTROLS, check_trim, main, parquet_texts, trim_spec
from tok_corpus import CJK, CODE, EMOJI, ENGLISH, LATEX, WHITESPACE

RAW = Path(__file__).resolve().parents[2] / "data" / "raw"
CORPUS = [RAW / "math_sft.parquet", RAW / "math_rl.parquet"]
OTHER_TEXT = ENGLISH + CODE + LATEX + EMOJI + CJK + WHITESPACE + ["x" * 300, "[INST] </s> <s>", "naïve café 🎉", ""]


@pytest.fixture(scope="module")
def base() -> Tokenizer:
    return Tokenizer.from_pretrained()


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return list(parquet_texts(CORPUS))


@pytest.fixture(scope="module")
def trimmed(base, texts):
    result = trim_spec(json.loads((VENDORED_DIR / "tokenizer.json").read_bytes()), base, texts)
    tok = Tokenizer.from_bytes(trim_mod.dumps(result.spec), "trimmed", {"bos_token": "<s>", "eos_token": "</s>"})
    return result, tok


def test_trim_is_exact_on_the_corpus_and_keeps_controls_and_bytes(base, texts, trimmed):
    result, tok = trimmed
    assert check_trim(base, tok, result.new_id, texts) == len(texts)
    assert len(texts) > 30_000
    # the controls keep their ids (they come first in the base), every byte piece is there
    assert [tok.token_to_id(c) for c in CHAT_CONTROLS] == [base.token_to_id(c) for c in CHAT_CONTROLS]
    assert (tok.bos_id, tok.eos_id) == (base.bos_id, base.eos_id)
    assert all(tok.token_to_id(f"<0x{b:02X}>") is not None for b in range(256))
    assert tok.vocab_size < 600 and result.corpus_pieces < 200  # of 32,768
    assert tok.token_to_id("[control_8]") is None and tok.token_to_id("[IMG]") is None


def test_any_text_still_encodes_and_decodes_to_itself(base, trimmed):
    _, tok = trimmed
    for text in OTHER_TEXT:
        ids = tok.encode(text)
        assert all(0 <= i < tok.vocab_size for i in ids)
        assert tok.decode(ids) == base.decode(base.encode(text)), text
    # a word the corpus never uses is spelt in smaller pieces, not replaced by <unk>
    assert len(tok.encode("zebra")) > len(base.encode("zebra"))
    assert tok.token_to_id("<unk>") not in tok.encode("zebra 🎉")


def test_chat_encoding_is_the_base_renumbered(base, trimmed):
    result, tok = trimmed
    for row in pq.read_table(CORPUS[0]).slice(0, 200).to_pylist():
        want, got = base.encode_chat(row["messages"]), tok.encode_chat(row["messages"])
        assert got.ids == [result.new_id[i] for i in want.ids]
        assert got.loss_mask == want.loss_mask


@pytest.mark.slow  # a mutation check of the trim algorithm: one more whole trim of the corpus
def test_the_merge_closure_is_needed(base, texts, monkeypatch):
    """Keeping only the final pieces (not the symbols BPE builds on the way) changes the encoding: check_trim
    catches it, so the closure is what makes the trim exact."""
    real = trim_mod.corpus_closure
    monkeypatch.setattr(trim_mod, "corpus_closure", lambda tok, xs: (lambda s, f: (f, f))(*real(tok, xs)))
    result = trim_spec(json.loads((VENDORED_DIR / "tokenizer.json").read_bytes()), base, texts)
    broken = Tokenizer.from_bytes(trim_mod.dumps(result.spec), "broken", {"bos_token": "<s>", "eos_token": "</s>"})
    with pytest.raises(ArtifactError, match="differs"):
        check_trim(base, broken, result.new_id, texts)


def test_cli_publishes_a_loadable_directory_deterministically(tmp_path, capsys):
    out = tmp_path / "trimmed"
    assert main(["--corpus", str(CORPUS[1]), "--out", str(out)]) == 0
    record = json.loads((out / "TRIM.json").read_text())
    tok = Tokenizer.from_pretrained(out)
    assert record["vocab_size"] == tok.vocab_size and record["base_vocab_size"] == 32768
    assert record["corpus"] == {str(CORPUS[1]): trim_mod.sha256_file(CORPUS[1])}
    assert tok.encode_prompt([{"role": "user", "content": "What is 2 + 3?"}])[:2] == [1, 3]
    first = (out / "tokenizer.json").read_bytes()
    assert main(["--corpus", str(CORPUS[1]), "--out", str(out)]) == 0
    assert (out / "tokenizer.json").read_bytes() == first
    assert not list(tmp_path.glob("*.partial-*"))
    decoder = json.loads((out / "tokenizer_config.json").read_text())["added_tokens_decoder"]
    assert {v["content"] for v in decoder.values()} == set(CHAT_CONTROLS)


def test_cli_refuses_a_missing_corpus_file_by_name(tmp_path, capsys):
    missing = tmp_path / "nope.parquet"
    assert main(["--corpus", str(missing), "--out", str(tmp_path / "t")]) == 2
    assert str(missing) in capsys.readouterr().err
    assert not (tmp_path / "t").exists()


@pytest.mark.oracle
def test_tokenizers_and_transformers_load_the_trimmed_directory_and_agree(texts):
    """On the vendored trim (test_the_vendored_tiny_tokenizer_is_the_trim_of_the_bundle: byte for byte what the
    command publishes for the bundle), so the command is not run twice."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    out = VENDORED_DIR.parent / "mistral-7b-v0.3-tiny"
    ours = Tokenizer.from_pretrained(out)
    theirs = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    for text in texts[::7] + OTHER_TEXT:
        assert theirs.encode(text, add_special_tokens=False).ids == ours.encode(text, parse_special=True), text
    hf = transformers.AutoTokenizer.from_pretrained(str(out))
    assert len(hf) == ours.vocab_size
    for row in pq.read_table(CORPUS[0]).slice(0, 50).to_pylist():
        want = hf.apply_chat_template(row["messages"], tokenize=True)
        want = want["input_ids"] if hasattr(want, "keys") else want
        assert ours.encode_chat(row["messages"]).ids == list(want)


def test_a_trim_that_fails_its_check_publishes_nothing(tmp_path, monkeypatch, capsys):
    def refuse(*_args):
        raise ArtifactError("trimmed tokenizer differs from the base on text 1")

    monkeypatch.setattr(trim_mod, "check_trim", refuse)
    out = tmp_path / "trimmed"
    assert main(["--corpus", str(CORPUS[1]), "--out", str(out)]) == 2
    assert "differs" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_the_vendored_tiny_tokenizer_is_the_trim_of_the_bundle(tmp_path):
    """assets/tokenizer/mistral-7b-v0.3-tiny is what the trim command gives today: a change to the bundle's text
    that needs another piece fails here (regenerate with the command in its README)."""
    vendored = VENDORED_DIR.parent / "mistral-7b-v0.3-tiny"
    record = json.loads((vendored / "TRIM.json").read_text())
    root = Path(__file__).resolve().parents[2]
    corpus = [root / p for p in record["corpus"]]
    assert {p: trim_mod.sha256_file(root / p) for p in record["corpus"]} == record["corpus"]
    assert main(["--corpus", *map(str, corpus), "--out", str(tmp_path / "t")]) == 0
    assert (tmp_path / "t" / "tokenizer.json").read_bytes() == (vendored / "tokenizer.json").read_bytes()
    assert (tmp_path / "t" / "tokenizer_config.json").read_bytes() == (vendored / "tokenizer_config.json").read_bytes()
    tok = Tokenizer.from_pretrained("mistral-7b-v0.3-tiny")  # the vendored name resolves like the base's
    assert tok.vocab_size == record["vocab_size"] == 555
