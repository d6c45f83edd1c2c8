"""`Tokenizer`: a Hugging Face tokenizer.json read and run in pure Python (no tokenizers/sentencepiece import).

Encoding follows tokenizers' pipeline: added tokens are cut out of the raw text, every other segment is
normalized, pre-tokenized into words, and each word is run through BPE; `add_special_tokens=True` applies the
post-processor. Two modes for text that spells a special token (`<s>`, `[INST]`):

- `parse_special=False` (default): the characters are ordinary text, and no special id can come out. This is
  sentencepiece's behaviour on `tokenizer.model.v3` and tokenizers' with `encode_special_tokens=True`.
- `parse_special=True`: they become the special id, as tokenizers' default `encode` does.

Decoding follows the tokenizer.json `decoder` (for Mistral: ▁ -> space, byte fallback, strip one leading space).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from align.exceptions import ArtifactError
from align.tokenizer.added_vocab import AddedVocab, parse_added_tokens
from align.tokenizer.bpe import BpeCacheConfig, BpeModel
from align.tokenizer.byte_level import symbols_to_bytes
from align.tokenizer.chat import ChatEncoding
from align.tokenizer.chat_format import ChatFormat, JinjaChat, chat_format_for, template_hash
from align.tokenizer.chat_template import SPECIAL_TOKEN_NAMES, ChatTemplate, find_chat_template
from align.tokenizer.decoders import build_decoder
from align.tokenizer.normalizers import build_normalizer
from align.tokenizer.offsets import Span, byte_char_index, plan_offsets, trim_offsets
from align.tokenizer.post_processors import build_post_processor
from align.tokenizer.pre_tokenizers import build_pre_tokenizer

MISTRAL_V03 = "mistral-7b-v0.3"
VENDORED_ROOT = Path(__file__).resolve().parents[2] / "assets" / "tokenizer"
VENDORED_DIR = VENDORED_ROOT / MISTRAL_V03


@dataclass(frozen=True)
class TokenizerConfig:
    """Which tokenizer to load and how much the word cache may hold."""

    # a directory holding tokenizer.json, or the name of a vendored one under assets/tokenizer/ ("mistral-7b-v0.3";
    # "mistral-7b-v0.3-tiny", its vocabulary trimmed to the bundled corpus by align.tokenizer.trim)
    path: str = MISTRAL_V03
    cache: BpeCacheConfig = BpeCacheConfig()


def resolve_tokenizer_dir(path_or_name: str | Path | None) -> Path:
    if path_or_name is None or str(path_or_name) == MISTRAL_V03:
        return VENDORED_DIR
    name = str(path_or_name)
    if "/" not in name and (VENDORED_ROOT / name / "tokenizer.json").is_file():
        return VENDORED_ROOT / name
    path = Path(path_or_name)
    return path.parent if path.name == "tokenizer.json" else path


class Tokenizer:
    def __init__(self, spec: dict, source: str, content_hash: str, special_names: dict[str, str | None],
                 cache: BpeCacheConfig = BpeCacheConfig(), chat_template: ChatTemplate | None = None,
                 chat_where: str | None = None):
        _refuse_unsupported(spec, source)
        added = parse_added_tokens(spec.get("added_tokens") or [], source)
        self._added = AddedVocab(added)
        self._pickle_args: tuple | None = None
        self.source = source
        self.content_hash = content_hash
        self._bpe = BpeModel(spec["model"], source, {t.content for t in added if t.special}, cache)
        self._normalize = build_normalizer(spec.get("normalizer"), f"{source}: normalizer")
        self._pre_tokenize = build_pre_tokenizer(spec.get("pre_tokenizer"), f"{source}: pre_tokenizer")
        self._post_process = build_post_processor(spec.get("post_processor"), f"{source}: post_processor")
        self._decode_tokens = build_decoder(spec.get("decoder"), f"{source}: decoder")
        self._token_to_id = dict(self._bpe.vocab)
        self._token_to_id.update(self._added.by_content)
        self._id_to_token: dict[int, str] = {i: t for t, i in self._bpe.vocab.items()}
        self._id_to_token.update({t.id: t.content for t in added})
        self.vocab_size = max(self._id_to_token) + 1 if self._id_to_token else 0
        self.bos_id, self.eos_id, self.pad_id = (self._special_id(special_names.get(k), k, source)
                                                 for k in ("bos_token", "eos_token", "pad_token"))
        self._offsets = plan_offsets(spec)
        self._token_bytes: dict[int, int] = {}
        has_inst = all(self._token_to_id.get(c) in self._added.special_ids for c in ("[INST]", "[/INST]"))
        # how conversations become ids + loss mask: from the directory's files (align.tokenizer.chat_format)
        self.chat: ChatFormat = chat_format_for(chat_template, special_names, has_inst, chat_where or source)

    # ---- loading -------------------------------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, path_or_name: str | Path | None = None,
                        cache: BpeCacheConfig = BpeCacheConfig()) -> Tokenizer:
        """A directory with tokenizer.json (and optionally tokenizer_config.json / special_tokens_map.json for
        bos/eos/pad); None or "mistral-7b-v0.3" loads the vendored copy in assets/tokenizer/."""
        directory = resolve_tokenizer_dir(path_or_name)
        file = directory / "tokenizer.json"
        if not file.is_file():
            hint = " (the vendored copy lives in the source tree: run from a checkout)" if directory == VENDORED_DIR else ""
            raise ArtifactError(f"{file}: tokenizer.json not found{hint}")
        return cls.from_bytes(file.read_bytes(), str(file), _special_names(directory), cache,
                              find_chat_template(directory), str(directory))

    @classmethod
    def from_bytes(cls, raw: bytes, source: str, special_names: dict[str, str | None],
                   cache: BpeCacheConfig = BpeCacheConfig(), chat_template: ChatTemplate | None = None,
                   chat_where: str | None = None) -> Tokenizer:
        """From the bytes of a tokenizer.json (`source` names it in errors) and the chat template beside it.
        `content_hash` is the file's sha256, or, where a Jinja template encodes chats, the sha256 of the file,
        the template and the special tokens it sees (so encoded data follows a template edit)."""
        try:
            spec = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ArtifactError(f"{source}: not valid JSON ({exc})") from exc
        if not isinstance(spec, dict) or not isinstance(spec.get("model"), dict):
            raise ArtifactError(f"{source}: expected a JSON object with a 'model' object")
        tok = cls(spec, source, hashlib.sha256(raw).hexdigest(), special_names, cache, chat_template, chat_where)
        if isinstance(tok.chat, JinjaChat):
            names = json.dumps(sorted((k, v) for k, v in special_names.items() if v is not None))
            tok.content_hash = hashlib.sha256(
                f"{tok.content_hash}\0{template_hash(chat_template.text)}\0{names}".encode()).hexdigest()
        tok._pickle_args = (raw, source, dict(special_names), cache, chat_template, chat_where)
        return tok

    def __reduce__(self):
        # NOTE: the components are closures (not picklable); a data-loader worker rebuilds from the JSON bytes
        if getattr(self, "_pickle_args", None) is None:
            raise TypeError("a Tokenizer built from a spec dict cannot be pickled; use from_pretrained/from_bytes")
        return (Tokenizer.from_bytes, self._pickle_args)

    @classmethod
    def from_config(cls, cfg: TokenizerConfig) -> Tokenizer:
        return cls.from_pretrained(cfg.path, cfg.cache)

    # ---- vocabulary ----------------------------------------------------------------------------------------

    @property
    def bpe(self) -> BpeModel:
        return self._bpe

    def token_to_id(self, token: str) -> int | None:
        return self._token_to_id.get(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._id_to_token.get(token_id)

    def is_special(self, token_id: int) -> bool:
        return token_id in self._added.special_ids

    # ---- encode / decode -----------------------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = False, parse_special: bool = False) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"encode expects str, got {type(text).__name__}")
        ids: list[int] = []
        for segment, token_id in self._added.split_raw(text, parse_special):
            if token_id is not None:
                ids.append(token_id)
            elif segment:
                ids.extend(self._encode_segment(segment, parse_special))
        return self._post_process(ids) if add_special_tokens else ids

    def _encode_segment(self, text: str, parse_special: bool) -> list[int]:
        """Ids of a text with no raw added token in it: normalize, cut normalized added tokens, pre-tokenize, BPE."""
        if self._normalize is not None:
            text = self._normalize(text)
        pieces = (self._added.split_normalized(text, parse_special) if self._added.has_normalized(parse_special)
                  else [(text, None)])
        ids: list[int] = []
        tokenize = self._bpe.tokenize
        for piece, token_id in pieces:
            if token_id is not None:
                ids.append(token_id)
                continue
            words = self._pre_tokenize(piece) if self._pre_tokenize is not None else ([piece] if piece else [])
            for word in words:
                ids.extend(tokenize(word))
        return ids

    def encode_offsets(self, text: str, parse_special: bool = True) -> tuple[list[int], list[Span]]:
        """`encode(text, parse_special=...)` and each token's character offsets in `text`, as tokenizers'
        `Encoding.offsets` (byte-level tokenizers; see align.tokenizer.offsets)."""
        plan = self._offsets
        if plan.refused:
            raise NotImplementedError(f"{self.source}: {plan.refused}")
        ids: list[int] = []
        spans: list[Span] = []
        pos = 0
        for segment, token_id in self._added.split_raw(text, parse_special):
            if token_id is not None:
                ids.append(token_id)
                spans.append((pos, pos + len(segment)))
            elif segment:
                self._segment_offsets(segment, pos, parse_special, ids, spans)
            pos += len(segment)
        if plan.trim is not None:
            spans = trim_offsets([self._id_to_token[i] for i in ids], spans, plan.trim)
        return ids, spans

    def _segment_offsets(self, segment: str, base: int, parse_special: bool, ids: list[int],
                         spans: list[Span]) -> None:
        normalized = self._normalize(segment) if self._normalize is not None else segment
        align = self._offsets.align(segment, normalized) if normalized != segment else None
        pieces = (self._added.split_normalized(normalized, parse_special) if self._added.has_normalized(parse_special)
                  else [(normalized, None)])

        def place(c0: int, c1: int) -> Span:  # normalized character range -> original offsets
            return (base + c0, base + c1) if align is None else (base + align[c0], base + align[c1 - 1] + 1)

        at = 0
        for piece, token_id in pieces:
            if token_id is not None:
                ids.append(token_id)
                spans.append(place(at, at + len(piece)))
            elif piece:
                char_of = byte_char_index(piece)
                b = 0
                words = self._pre_tokenize(piece) if self._pre_tokenize is not None else [piece]
                for token_id in (t for word in words for t in self._bpe.tokenize(word)):
                    width = self._token_bytes.get(token_id)
                    if width is None:
                        width = self._token_bytes[token_id] = len(symbols_to_bytes(self._id_to_token[token_id]))
                    ids.append(token_id)
                    spans.append(place(at + char_of[b], at + char_of[b + width - 1] + 1))
                    b += width
                if b != len(char_of):
                    raise NotImplementedError(f"{self.source}: the pre-tokenizer does not keep every byte of the "
                                              f"text; token offsets are not available")
            at += len(piece)

    def pre_tokenize(self, text: str) -> list[str]:
        """The words BPE sees for a text holding no added token: normalized, then pre-tokenized (for debugging
        and for the pre-tokenizer parity test)."""
        if self._normalize is not None:
            text = self._normalize(text)
        return self._pre_tokenize(text) if self._pre_tokenize is not None else ([text] if text else [])

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        table = self._id_to_token
        tokens = []
        for raw in ids:
            token_id = int(raw)
            token = table.get(token_id)
            if token is None:
                raise ValueError(f"decode: token id {token_id} is not in the vocabulary of {self.source}")
            if skip_special_tokens and token_id in self._added.special_ids:
                continue
            tokens.append(token)
        return self._decode_tokens(tokens)

    # ---- chat: the directory's own format (align.tokenizer.chat_format) ------------------------------------

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = False, tools: list[dict] | None = None,
                    **template_kwargs) -> ChatEncoding:
        """Ids and loss mask (1 on assistant output) of a conversation, in this tokenizer's chat format."""
        return self.chat.encode_chat(self, messages, add_generation_prompt, tools, **template_kwargs)

    def encode_prompt(self, messages: list[dict], tools: list[dict] | None = None, **template_kwargs) -> list[int]:
        """The ids a model continues from (the generation prompt included): SFT-free prompts, rollouts."""
        return self.chat.encode_prompt(self, messages, tools, **template_kwargs)

    def cache_size(self) -> int:
        return self._bpe.cache_size()

    def _special_id(self, name: str | None, key: str, source: str) -> int | None:
        if name is None:
            return None
        token_id = self._token_to_id.get(name)
        if token_id is None:
            raise ArtifactError(f"{source}: {key} {name!r} is not a token of this vocabulary")
        return token_id


def _special_names(directory: Path) -> dict[str, str | None]:
    """Named special token strings (bos/eos/pad/unk/...) from tokenizer_config.json, then special_tokens_map.json
    (which wins): bos/eos/pad give ids; all of them are variables of a chat template, as in transformers."""
    names: dict[str, str | None] = {}
    for filename in ("tokenizer_config.json", "special_tokens_map.json"):
        path = directory / filename
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ArtifactError(f"{path}: not valid JSON ({exc})") from exc
        for key in SPECIAL_TOKEN_NAMES:
            if key in data:
                value = data[key]
                names[key] = value.get("content") if isinstance(value, dict) else value
    return names


def _refuse_unsupported(spec: dict, source: str) -> None:
    for key in ("truncation", "padding"):
        if spec.get(key) is not None:
            raise NotImplementedError(f"{source}: '{key}' is set; align.tokenizer does not truncate or pad")
