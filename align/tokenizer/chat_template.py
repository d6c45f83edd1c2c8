"""A checkpoint's own Jinja chat template, rendered exactly as transformers' `apply_chat_template` renders it.

The environment is the one transformers builds (utils/chat_template_utils.py): an `ImmutableSandboxedEnvironment`
with trim_blocks and lstrip_blocks, the `loopcontrols` extension, a `{% generation %}` tag that records the
character span of what it renders, and the globals/filters transformers adds (`raise_exception`, `strftime_now`,
`tojson` without HTML escaping, a limited `dict`, a `namespace` refusing underscore names). Messages are cleaned as
transformers cleans them (keys whose value is None dropped, reasoning fields aliased), and the template sees the
tokenizer's named special tokens (`bos_token`, `eos_token`, ...) as variables, as it does there.

Templates are untrusted code from a model hub: the sandbox is why jinja2 and nothing looser.
"""

from __future__ import annotations

import json
import re
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import jinja2
import numpy as np
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from align.exceptions import ArtifactError, DataError

TEMPLATE_FILE = "chat_template.jinja"
CONFIG_FILE = "tokenizer_config.json"
# the tokens transformers passes to a template by name (PreTrainedTokenizerBase.SPECIAL_TOKENS_ATTRIBUTES)
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_GENERATION_TAG = re.compile(r"\{\%-?\s*generation\s*-?\%\}")
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")

Span = tuple[int, int]


@dataclass(frozen=True)
class ChatTemplate:
    """The template text and where it came from (named in every error)."""

    text: str
    source: str

    @property
    def has_generation(self) -> bool:
        """Whether the template marks assistant output with `{% generation %}` (the loss mask comes from it)."""
        return _GENERATION_TAG.search(self.text) is not None


def find_chat_template(directory: Path) -> ChatTemplate | None:
    """The directory's chat template as transformers loads it: `chat_template.jinja` wins over the
    `chat_template` key of tokenizer_config.json; a list of named templates yields its "default" one."""
    file = directory / TEMPLATE_FILE
    if file.is_file():
        return ChatTemplate(file.read_text(encoding="utf-8"), str(file))
    config = directory / CONFIG_FILE
    if not config.is_file():
        return None
    try:
        value = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as exc:
        raise ArtifactError(f"{config}: not a valid JSON object ({exc})") from exc
    if value is None:
        return None
    if isinstance(value, list):
        named = {item.get("name"): item.get("template") for item in value if isinstance(item, dict)}
        if "default" not in named:
            raise ArtifactError(f"{config}: chat_template is a list of named templates without a 'default' one "
                                f"(names: {sorted(str(k) for k in named)})")
        value = named["default"]
    if not isinstance(value, str) or not value:
        raise ArtifactError(f"{config}: chat_template must be a non-empty string, got {type(value).__name__}")
    return ChatTemplate(value, f"{config}: chat_template")


# ---- the environment ---------------------------------------------------------------------------------------


class _GenerationTracker(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: renders its body and, while a render is tracked, records the
    character span the body occupies in the output (transformers' AssistantTracker)."""

    tags = {"generation"}

    def __init__(self, environment: jinja2.Environment):
        super().__init__(environment)
        environment.extend(track_generation=self.track)
        self._tracking: ContextVar = ContextVar("generation_tracking", default=None)

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_generation", []), [], [], body).set_lineno(lineno)

    def _generation(self, caller) -> str:
        rendered = caller()
        tracking = self._tracking.get()
        if tracking is not None:
            blocks, spans = tracking
            start = sum(len(b) for b in blocks)
            spans.append((start, start + len(rendered)))
        return rendered

    @contextmanager
    def track(self, blocks: list[str], spans: list[Span]):
        token = self._tracking.set((blocks, spans))
        try:
            yield
        finally:
            self._tracking.reset(token)


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers' override: jinja's own tojson escapes HTML characters, which no chat format wants
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format):
    return datetime.now().strftime(format)


class _TemplateDict:
    """`dict(...)` in a template, without the type itself (no attribute access to break out of the sandbox)."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """`namespace(...)` refusing underscore-prefixed attributes (a path to CPython internals)."""

    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot store underscore-prefixed attributes on a namespace, got {name!r}")


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                       extensions=[_GenerationTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env


# ---- inputs, as transformers cleans them -------------------------------------------------------------------


def _plain(value):
    """JSON-like data only: what a template may see (a tuple stays a tuple, as in transformers)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, np.generic):  # np.bool_(False) must not become a truthy placeholder string
        return _plain(value.item())
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    return f"<{type(value).__name__}>"


def _clean_messages(messages: list[dict]) -> list[dict]:
    """Keys whose value is None dropped, then `reasoning_content`/`thinking` filled from any reasoning field."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise DataError("chat: messages must be a non-empty list of message dicts")
    out = []
    for n, message in enumerate(messages):
        if not isinstance(message, dict):
            raise DataError(f"chat: message {n} must be a dict, got {type(message).__name__}")
        message = _plain({k: v for k, v in message.items() if v is not None})
        reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


# ---- rendering ---------------------------------------------------------------------------------------------


class ChatRenderer:
    """One compiled template plus the special-token variables it sees."""

    def __init__(self, template: ChatTemplate, special_tokens: dict[str, str]):
        self.template = template
        self._variables = {k: v for k, v in special_tokens.items() if v is not None}
        try:
            self._compiled = _environment().from_string(template.text)
        except jinja2.TemplateError as exc:
            raise ArtifactError(f"{template.source}: the chat template does not compile: "
                                f"{type(exc).__name__}: {exc}") from exc

    def render(self, messages: list[dict], add_generation_prompt: bool = False, tools: list[dict] | None = None,
               **kwargs) -> tuple[str, list[Span]]:
        """(rendered text, character spans of the `{% generation %}` blocks, in order)."""
        variables = {**self._variables, **_plain(kwargs)}
        blocks: list[str] = []
        spans: list[Span] = []
        try:
            with self._compiled.environment.track_generation(blocks, spans):
                for block in self._compiled.generate(messages=_clean_messages(messages), tools=_plain(tools),
                                                     documents=None, add_generation_prompt=add_generation_prompt,
                                                     **variables):
                    blocks.append(block)
        except Exception as exc:  # noqa: BLE001 - template code is foreign: any failure is the template's
            raise DataError(f"{self.template.source}: the chat template fails to render this conversation: "
                            f"{type(exc).__name__}: {exc}") from exc
        return "".join(blocks), spans

    def text(self, messages: list[dict], add_generation_prompt: bool = False, tools: list[dict] | None = None,
             **kwargs) -> str:
        return self.render(messages, add_generation_prompt, tools, **kwargs)[0]
