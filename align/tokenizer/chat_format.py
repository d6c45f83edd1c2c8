"""The seam between a tokenizer directory and how conversations become ids + loss mask: chosen from the
directory's files, never from a model family's name.

- A chat template (chat_template.jinja, or `chat_template` in tokenizer_config.json) -> `JinjaChat`: the
  checkpoint's own template rendered as transformers renders it, the rendered text tokenized whole (control
  tokens parsed, as `apply_chat_template` does), the loss mask from `{% generation %}` spans when the template
  has them, else from the prefix rule below.
- The Mistral v0.3 template that `align.tokenizer.chat` implements (known by content hash), or no template and a
  vocabulary with the `[INST]`/`[/INST]` controls -> `MistralChat` (`align.tokenizer.chat`, unchanged: it keeps
  message text from ever becoming control ids and needs no Jinja; the tiny/smoke golden anchors rest on it).
- Neither -> `NoChatTemplate`, which refuses with the directory named (a base model's tokenizer).

Prefix rule (templates without `{% generation %}`): assistant message k spans from the end of the render of
messages[:k] with the generation prompt to the end of the render of messages[:k+1]; both renders must be prefixes
of the whole conversation's render, else the template rewrites earlier turns (Qwen 3 drops the reasoning of
earlier assistant turns) and the mask needs `{% generation %}` blocks: one clear error says so.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Protocol

from align.exceptions import ArtifactError, DataError
from align.tokenizer import chat
from align.tokenizer.chat import ChatEncoding
from align.tokenizer.chat_template import ChatRenderer, ChatTemplate, Span
from align.tokenizer.offsets import overlap_mask

if TYPE_CHECKING:
    from align.tokenizer.tokenizer import Tokenizer

# sha256 of the template text align.tokenizer.chat implements (assets/tokenizer/mistral-7b-v0.3/chat_template.jinja)
MISTRAL_V03_TEMPLATES = frozenset({"8c2de69b9b76920bfa346819d9c268fa706d7069c9cdeacd6cabc97a517e0b8d"})


class ChatFormat(Protocol):
    name: str

    def encode_chat(self, tok: Tokenizer, messages: list[dict], add_generation_prompt: bool = False,
                    tools: list[dict] | None = None, **template_kwargs) -> ChatEncoding: ...

    def encode_prompt(self, tok: Tokenizer, messages: list[dict], tools: list[dict] | None = None,
                      **template_kwargs) -> list[int]: ...


class MistralChat:
    name = "mistral-v0.3"

    def encode_chat(self, tok, messages, add_generation_prompt=False, tools=None, **template_kwargs):
        _no_extras(tools, template_kwargs)
        return chat.encode_chat(tok, messages, add_generation_prompt)

    def encode_prompt(self, tok, messages, tools=None, **template_kwargs):
        _no_extras(tools, template_kwargs)
        return chat.encode_prompt(tok, messages)


# variables every caller may pin and the v0.3 template does not read (its text has no date): taken, ignored
MISTRAL_IGNORED_VARIABLES = frozenset({"date_string"})


def _no_extras(tools, template_kwargs) -> None:
    template_kwargs = {k: v for k, v in template_kwargs.items() if k not in MISTRAL_IGNORED_VARIABLES}
    if tools is not None or template_kwargs:
        raise DataError("chat: the Mistral v0.3 format takes no tools or template variables "
                        f"(got {'tools' if tools is not None else sorted(template_kwargs)})")


class NoChatTemplate:
    name = "none"

    def __init__(self, where: str):
        self.where = where

    def _refuse(self):
        raise ArtifactError(f"{self.where}: no chat template (no chat_template.jinja and no 'chat_template' in "
                            f"tokenizer_config.json): a base model's tokenizer; use its instruct model's tokenizer "
                            f"directory or put the chat template you train with in chat_template.jinja")

    def encode_chat(self, tok, messages, add_generation_prompt=False, tools=None, **template_kwargs):
        self._refuse()

    def encode_prompt(self, tok, messages, tools=None, **template_kwargs):
        self._refuse()


class JinjaChat:
    name = "jinja"

    def __init__(self, template: ChatTemplate, special_tokens: dict[str, str | None]):
        self.renderer = ChatRenderer(template, {k: v for k, v in special_tokens.items() if v is not None})
        self.template = template

    def encode_chat(self, tok, messages, add_generation_prompt=False, tools=None, **template_kwargs):
        text, spans = self.renderer.render(messages, add_generation_prompt, tools, **template_kwargs)
        if not self.template.has_generation:
            spans = self.prefix_spans(messages, text, tools, template_kwargs)
        ids, offsets = tok.encode_offsets(text)
        return ChatEncoding(ids, overlap_mask(offsets, spans))

    def encode_prompt(self, tok, messages, tools=None, **template_kwargs):
        if not messages or not isinstance(messages[-1], dict) or messages[-1].get("role") == "assistant":
            raise DataError(f"{self.template.source}: a prompt must end with a user (or tool) message, "
                            f"not an assistant one")
        return tok.encode(self.renderer.text(messages, True, tools, **template_kwargs), parse_special=True)

    def prefix_spans(self, messages: list[dict], text: str, tools, template_kwargs: dict) -> list[Span]:
        spans = []
        for k, message in enumerate(messages):
            if message.get("role") != "assistant":
                continue
            if k == 0:
                raise DataError(f"chat: message 0 is an assistant message; the loss mask of {self.template.source} "
                                f"is found by rendering the messages before each assistant turn")
            before = self.renderer.text(messages[:k], True, tools, **template_kwargs)
            through = self.renderer.text(messages[:k + 1], False, tools, **template_kwargs)
            if not (text.startswith(before) and text.startswith(through) and len(before) <= len(through)):
                raise DataError(
                    f"{self.template.source}: assistant message {k} renders differently once later messages follow "
                    f"(the template rewrites earlier turns), so its loss mask cannot be found by prefix rendering; "
                    f"use a template with {{% generation %}} blocks around assistant output (chat_template.jinja)")
            spans.append((len(before), len(through)))
        return spans


def chat_format_for(template: ChatTemplate | None, special_tokens: dict[str, str | None], has_inst_controls: bool,
                    where: str) -> ChatFormat:
    """The chat format of a tokenizer directory from its files alone: its chat template (`find_chat_template`)
    and whether its vocabulary has the `[INST]`/`[/INST]` control tokens. `where` names it in errors."""
    if template is not None:
        if template_hash(template.text) in MISTRAL_V03_TEMPLATES:
            return MistralChat()
        return JinjaChat(template, special_tokens)
    if has_inst_controls:
        return MistralChat()
    return NoChatTemplate(where)


def template_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
