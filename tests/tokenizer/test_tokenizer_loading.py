"""Loading tokenizer.json: the vendored copy, content hash, clear errors, and refusal of unknown features."""

from __future__ import annotations

import copy
import hashlib
import json

import pytest

from align.exceptions import ArtifactError
from align.tokenizer import Tokenizer
from align.tokenizer.tokenizer import VENDORED_DIR

_TINY = {
    "version": "1.0", "truncation": None, "padding": None,
    "added_tokens": [{"id": 0, "content": "<s>", "special": True, "normalized": False,
                      "lstrip": False, "rstrip": False, "single_word": False}],
    "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                                                       {"type": "Replace", "pattern": {"String": " "},
                                                        "content": "\u2581"}]},
    "pre_tokenizer": None,
    "post_processor": None,
    "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                                                 {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1,
                                                                    "stop": 0}]},
    "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "fuse_unk": True, "byte_fallback": False,
              "ignore_merges": False,
              "vocab": {"<s>": 0, "<unk>": 1, "\u2581": 2, "a": 3, "b": 4, "ab": 5, "\u2581ab": 6},
              "merges": [["a", "b"], ["\u2581", "ab"]]},
}


def _write(tmp_path, spec) -> str:
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    return str(tmp_path)


def test_vendored_copy_and_content_hash():
    tok = Tokenizer.from_pretrained()
    same = Tokenizer.from_pretrained("mistral-7b-v0.3")
    expected = hashlib.sha256((VENDORED_DIR / "tokenizer.json").read_bytes()).hexdigest()
    assert tok.content_hash == same.content_hash == expected
    assert (tok.vocab_size, tok.bos_id, tok.eos_id, tok.pad_id) == (32768, 1, 2, None)
    assert tok.token_to_id("[INST]") == 3 and tok.id_to_token(4) == "[/INST]" and tok.token_to_id("nope!") is None
    assert Tokenizer.from_pretrained(VENDORED_DIR / "tokenizer.json").content_hash == expected


def test_tiny_tokenizer_from_a_directory(tmp_path):
    tok = Tokenizer.from_pretrained(_write(tmp_path, _TINY))
    assert tok.encode("ab ab") == [6, 6]
    assert tok.encode("abc") == [6, 1]  # unknown 'c' -> <unk>
    assert tok.encode("acca") == [2, 3, 1, 3]  # fuse_unk: one <unk> for the run
    assert tok.decode([6, 6]) == "ab ab"
    assert tok.bos_id is None  # no tokenizer_config.json / special_tokens_map.json


def test_special_token_names_come_from_the_config_files(tmp_path):
    _write(tmp_path, _TINY)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": {"content": "<s>"}, "eos_token": "<s>"}))
    tok = Tokenizer.from_pretrained(str(tmp_path))
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (0, 0, None)
    (tmp_path / "special_tokens_map.json").write_text(json.dumps({"pad_token": "<zzz>"}))
    with pytest.raises(ArtifactError, match="pad_token '<zzz>'"):
        Tokenizer.from_pretrained(str(tmp_path))


def test_missing_and_malformed_files_are_named(tmp_path):
    with pytest.raises(ArtifactError, match="tokenizer.json not found"):
        Tokenizer.from_pretrained(str(tmp_path))
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ArtifactError, match=r"tokenizer\.json: not valid JSON"):
        Tokenizer.from_pretrained(str(tmp_path))
    bad = copy.deepcopy(_TINY)
    bad["model"]["merges"].append(["a", "zz"])
    with pytest.raises(ArtifactError, match=r"model\.merges\[2\]"):
        Tokenizer.from_pretrained(_write(tmp_path, bad))


@pytest.mark.parametrize("path, value, fragment", [
    (("model", "type"), "Unigram", "model.type 'Unigram'"),
    (("model", "dropout"), 0.1, "dropout"),
    (("model", "continuing_subword_prefix"), "##", "continuing_subword_prefix"),
    (("normalizer",), {"type": "Strip", "left": True, "right": True}, "normalizer type 'Strip'"),
    (("pre_tokenizer",), {"type": "Metaspace", "replacement": "\u2581"}, "pre_tokenizer type 'Metaspace'"),
    (("pre_tokenizer",), {"type": "Split", "pattern": {"Regex": "\\w+"}, "behavior": "Isolated", "invert": False},
     r"\\w"),
    (("decoder",), {"type": "WordPiece"}, "decoder type 'WordPiece'"),
    (("post_processor",), {"type": "BertProcessing"}, "post_processor type 'BertProcessing'"),
    (("truncation",), {"max_length": 8}, "truncation"),
])
def test_unknown_features_raise_not_implemented(tmp_path, path, value, fragment):
    spec = copy.deepcopy(_TINY)
    node = spec
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(NotImplementedError, match=fragment):
        Tokenizer.from_pretrained(_write(tmp_path, spec))


def test_added_token_flags_are_refused(tmp_path):
    spec = copy.deepcopy(_TINY)
    spec["added_tokens"][0]["lstrip"] = True
    with pytest.raises(NotImplementedError, match="lstrip"):
        Tokenizer.from_pretrained(_write(tmp_path, spec))


def test_decode_rejects_unknown_ids():
    tok = Tokenizer.from_pretrained()
    with pytest.raises(ValueError, match="token id 40000"):
        tok.decode([1, 40000])
    with pytest.raises(ValueError, match="token id -1"):
        tok.decode([-1])


def test_pickles_for_data_loader_workers():
    import pickle

    tok = Tokenizer.from_pretrained()
    clone = pickle.loads(pickle.dumps(tok))
    text = "Pickled in a worker: [INST] 日本 😀"
    assert clone.encode(text) == tok.encode(text) and clone.content_hash == tok.content_hash
    assert (clone.bos_id, clone.eos_id, clone.encode_chat([{"role": "user", "content": "x"}]).ids) == (
        tok.bos_id, tok.eos_id, tok.encode_chat([{"role": "user", "content": "x"}]).ids)
