"""Chat templates without the reference libraries: the renderer's environment (sandbox, transformers' globals and
filters), the assistant mask from `{% generation %}` spans and from the prefix rule, offsets of multi-byte
characters, how a tokenizer directory's files choose its chat format, and the errors (parity with transformers:
test_chat_template_oracle.py).

The tokenizer here is a byte-level tokenizer.json with no merges (one token per UTF-8 byte, two control tokens),
so every expected id and mask is written out from the bytes of the rendered text."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from align.exceptions import ArtifactError, DataError
from align.tokenizer import Tokenizer
from align.tokenizer.byte_level import BYTE_TO_CHAR
from align.tokenizer.tokenizer import VENDORED_DIR

IM_START, IM_END = 256, 257
PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n"
          "{% if m.role == 'assistant' %}{% generation %}{{ m.content }}<|im_end|>{% endgeneration %}"
          "{% else %}{{ m.content }}<|im_end|>{% endif %}{{ '\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
PLAIN = CHATML.replace("{% generation %}", "").replace("{% endgeneration %}", "")
CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Café? 😀"},
                {"role": "assistant", "content": "Oui, café ☕."}, {"role": "user", "content": "x"},
                {"role": "assistant", "content": "y"}]


def _spec() -> dict:
    token = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": IM_START, "content": "<|im_start|>", **token},
                         {"id": IM_END, "content": "<|im_end|>", **token}],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": PATTERN}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {BYTE_TO_CHAR[b]: b for b in range(256)}, "merges": []},
    }


def _directory(tmp_path, template: str | None = None, config_template=None):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "tokenizer.json").write_text(json.dumps(_spec()), encoding="utf-8")
    config = {"eos_token": "<|im_end|>"}
    if config_template is not None:
        config["chat_template"] = config_template
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    if template is not None:
        (tmp_path / "chat_template.jinja").write_text(template, encoding="utf-8")
    return tmp_path


def _expected(pieces: list[tuple[str | int, int]]) -> tuple[list[int], list[int]]:
    """(text or control id, mask) pieces -> one id per UTF-8 byte / control token, with its mask."""
    ids, mask = [], []
    for piece, m in pieces:
        got = [piece] if isinstance(piece, int) else list(piece.encode("utf-8"))
        ids += got
        mask += [m] * len(got)
    return ids, mask


def test_generation_blocks_give_the_mask(tmp_path):
    tok = Tokenizer.from_pretrained(str(_directory(tmp_path, CHATML)))
    enc = tok.encode_chat(CONVERSATION)
    assert (enc.ids, enc.loss_mask) == _expected([
        (IM_START, 0), ("system\nBe brief.", 0), (IM_END, 0), ("\n", 0),
        (IM_START, 0), ("user\nCafé? 😀", 0), (IM_END, 0), ("\n", 0),
        (IM_START, 0), ("assistant\n", 0), ("Oui, café ☕.", 1), (IM_END, 1), ("\n", 0),
        (IM_START, 0), ("user\nx", 0), (IM_END, 0), ("\n", 0),
        (IM_START, 0), ("assistant\n", 0), ("y", 1), (IM_END, 1), ("\n", 0)])
    assert tok.decode(enc.ids) == tok.chat.renderer.text(CONVERSATION)


def test_prefix_rule_without_generation_blocks(tmp_path):
    """From the end of the generation prompt to the end of the assistant message's own render: here the newline
    after <|im_end|> is the message's, so it is learned too."""
    tok = Tokenizer.from_pretrained(str(_directory(tmp_path, PLAIN)))
    enc = tok.encode_chat(CONVERSATION)
    assert (enc.ids, enc.loss_mask) == _expected([
        (IM_START, 0), ("system\nBe brief.", 0), (IM_END, 0), ("\n", 0),
        (IM_START, 0), ("user\nCafé? 😀", 0), (IM_END, 0), ("\n", 0),
        (IM_START, 0), ("assistant\n", 0), ("Oui, café ☕.", 1), (IM_END, 1), ("\n", 1),
        (IM_START, 0), ("user\nx", 0), (IM_END, 0), ("\n", 0),
        (IM_START, 0), ("assistant\n", 0), ("y", 1), (IM_END, 1), ("\n", 1)])


def test_generation_prompt_for_rollouts(tmp_path):
    tok = Tokenizer.from_pretrained(str(_directory(tmp_path, CHATML)))
    prompt = CONVERSATION[:2]
    assert tok.encode_prompt(prompt) == _expected([
        (IM_START, 0), ("system\nBe brief.", 0), (IM_END, 0), ("\n", 0), (IM_START, 0), ("user\nCafé? 😀", 0),
        (IM_END, 0), ("\n", 0), (IM_START, 0), ("assistant\n", 0)])[0]
    with pytest.raises(DataError, match="must end with a user"):
        tok.encode_prompt(CONVERSATION)


def test_a_rewriting_template_is_refused_by_the_prefix_rule(tmp_path):
    """A template that renders an earlier assistant turn differently once later turns follow (as Qwen 3 drops
    earlier reasoning) has no prefix-rule mask: one error naming the template file and the message."""
    rewriting = PLAIN.replace("{{ m.content }}<|im_end|>{% else %}",
                              "{{ m.content if loop.last else 'old' }}<|im_end|>{% else %}")
    tok = Tokenizer.from_pretrained(str(_directory(tmp_path, rewriting)))
    with pytest.raises(DataError, match=r"chat_template\.jinja: assistant message 2 renders differently .*"
                                        r"\{% generation %\}"):
        tok.encode_chat(CONVERSATION)


def test_transformers_environment(tmp_path):
    template = ("{{ tools | tojson }}|{{ bos_token is defined }}|{{ eos_token }}|{{ strftime_now('%Y') | length }}|"
                "{% set ns = namespace(n=0) %}{% for m in messages %}{% if m.tool_calls is defined %}T"
                "{% endif %}{% set ns.n = ns.n + 1 %}{% if loop.index > 1 %}{% break %}{% endif %}{% endfor %}"
                "{{ ns.n }}|{{ dict(a=1) | tojson }}|{{ reasoning_content is defined }}"
                "{{ messages[0].reasoning_content }}{{ messages[0].thinking }}|{{ flag }}")
    tok = Tokenizer.from_pretrained(str(_directory(tmp_path, template)))
    messages = [{"role": "user", "content": "a", "tool_calls": None, "reasoning": "r"},
                {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
    tools = [{"name": "<b>é</b>"}]
    text = tok.chat.renderer.text(messages, tools=tools, flag=7)
    # tojson: no HTML escaping, non-ASCII kept; None-valued keys dropped; reasoning aliased; loop controls;
    # named special tokens that the directory sets are variables, the others are undefined
    assert text == '[{"name": "<b>é</b>"}]|False|<|im_end|>|4|2|{"a": 1}|Falserr|7'


@pytest.mark.parametrize("template", [
    "{{ messages.__class__.__mro__ }}",
    "{% set x = messages.append(1) %}",
    "{% set ns = namespace() %}{% set ns._private = 1 %}",
])
def test_the_sandbox_refuses_escapes(tmp_path, template):
    tok = Tokenizer.from_pretrained(str(_directory(tmp_path, template)))
    with pytest.raises(DataError, match=r"chat_template\.jinja: the chat template fails to render .*SecurityError"):
        tok.chat.renderer.text([{"role": "user", "content": "x"}])


def test_raise_exception_names_the_file_and_the_message(tmp_path):
    tok = Tokenizer.from_pretrained(str(_directory(tmp_path, "{{ raise_exception('roles must alternate') }}")))
    with pytest.raises(DataError, match=r"chat_template\.jinja: the chat template fails to render this conversation: "
                                        r"TemplateError: roles must alternate"):
        tok.encode_chat([{"role": "user", "content": "x"}])


def test_template_sources(tmp_path):
    """tokenizer_config.json's chat_template (a string or named templates: the "default" one); chat_template.jinja
    wins over both."""
    named = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": CHATML}]
    tok = Tokenizer.from_pretrained(str(_directory(tmp_path / "a", None, named)))
    assert tok.chat.template.source.endswith("tokenizer_config.json: chat_template")
    assert tok.encode_chat(CONVERSATION[1:3]).loss_mask.count(1) > 0
    tok = Tokenizer.from_pretrained(str(_directory(tmp_path / "b", PLAIN, CHATML)))
    assert tok.chat.template.source.endswith("chat_template.jinja") and not tok.chat.template.has_generation
    with pytest.raises(ArtifactError, match="without a 'default' one"):
        Tokenizer.from_pretrained(str(_directory(tmp_path / "c", None, [{"name": "x", "template": "T"}])))


def test_no_template_and_no_inst_controls_is_refused_with_the_directory(tmp_path):
    directory = _directory(tmp_path)
    tok = Tokenizer.from_pretrained(str(directory))
    assert tok.encode("hi") == list(b"hi")
    with pytest.raises(ArtifactError, match=f"{tmp_path}: no chat template"):
        tok.encode_chat(CONVERSATION)


@pytest.mark.parametrize("name", ["mistral-7b-v0.3", "mistral-7b-v0.3-tiny"])
def test_the_vendored_mistral_directories_keep_the_mistral_encoder(name):
    """Their chat_template.jinja is the template align.tokenizer.chat implements (known by hash): the [INST]
    encoder stays, and so does content_hash (the sha256 of tokenizer.json, which the golden anchors rest on)."""
    tok = Tokenizer.from_pretrained(name)
    assert tok.chat.name == "mistral-v0.3"
    assert tok.content_hash == hashlib.sha256((VENDORED_DIR.parent / name / "tokenizer.json").read_bytes()).hexdigest()


def test_another_template_over_the_mistral_vocabulary_renders_but_has_no_offsets(tmp_path):
    """Token offsets (hence template masks) are implemented for byte-level BPE; a SentencePiece-style tokenizer
    with its own template still encodes rollout prompts, and asking for a mask is one clear refusal."""
    for file in ("tokenizer.json", "special_tokens_map.json", "tokenizer_config.json"):
        shutil.copy(VENDORED_DIR / file, tmp_path / file)
    (tmp_path / "chat_template.jinja").write_text(
        "{{ bos_token }}{% for m in messages %}[INST] {{ m.content }}[/INST]{% endfor %}", encoding="utf-8")
    tok = Tokenizer.from_pretrained(str(tmp_path))
    assert tok.chat.name == "jinja"
    assert tok.encode_prompt([{"role": "user", "content": "hi"}]) == [1, 3, 29473, 12782, 4]
    with pytest.raises(NotImplementedError, match=r"tokenizer\.json: pre_tokenizer: token offsets are implemented "
                                                  r"for byte-level BPE only"):
        tok.encode_chat([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])


def test_pickling_keeps_the_chat_format(tmp_path):
    import pickle

    tok = Tokenizer.from_pretrained(str(_directory(tmp_path, CHATML)))
    again = pickle.loads(pickle.dumps(tok))
    assert again.content_hash == tok.content_hash
    assert again.encode_chat(CONVERSATION) == tok.encode_chat(CONVERSATION)
