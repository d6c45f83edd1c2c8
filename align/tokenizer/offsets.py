"""Character offsets of each token in the original text, as `tokenizers` reports them (`Encoding.offsets`), for
byte-level BPE tokenizers: what a chat template's assistant mask is computed from (a token is assistant output
when its offsets overlap a `{% generation %}` span, transformers' rule).

Byte-level BPE keeps every byte of the (normalized) text, so a token's offsets follow from its byte length: a
token holding part of a multi-byte character covers that whole character, as in tokenizers, where every byte
symbol is aligned to the character it came from. Supported: no normalizer, or a Unicode normal form (the
alignment of a changed character follows tokenizers: a composed character takes the first original character's
place and the characters after it keep theirs, an inserted one takes its predecessor's; replayed per character
and checked against unicodedata); pre-tokenizers that keep every byte (Split without `Removed`, ByteLevel
without `add_prefix_space`); the ByteLevel post-processor's `trim_offsets`. Anything else is refused by name.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

from align.tokenizer.byte_level import BYTE_TO_CHAR

Span = tuple[int, int]
# Unicode White_Space (Rust's char::is_whitespace, which tokenizers' offset trimming uses)
WHITE_SPACE = frozenset("\t\n\x0b\x0c\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000"
                        + "".join(chr(c) for c in range(0x2000, 0x200B)))
_SPACE_SYMBOL = BYTE_TO_CHAR[ord(" ")]

# normalized text -> for each of its characters, the index of the original character it is aligned to
Aligner = Callable[[str, str], list[int]]


@dataclass(frozen=True)
class OffsetPlan:
    """How offsets are computed for one tokenizer.json, or why they cannot be (`refused`)."""

    align: Aligner | None = None  # None: the normalizer never changes the text
    trim: bool | None = None  # None: no trimming; else trim with this add_prefix_space
    refused: str | None = None


def plan_offsets(spec: dict) -> OffsetPlan:
    refused = _pre_tokenizer_refusal(spec.get("pre_tokenizer"))
    if refused:
        return OffsetPlan(refused=refused)
    align, refused = _normalizer_aligner(spec.get("normalizer"))
    if refused:
        return OffsetPlan(refused=refused)
    return OffsetPlan(align=align, trim=_trim_setting(spec.get("post_processor")))


def _steps(spec: dict | None, key: str) -> list[dict]:
    if spec is None:
        return []
    return [s for sub in spec[key] for s in _steps(sub, key)] if spec.get("type") == "Sequence" else [spec]


def _pre_tokenizer_refusal(spec: dict | None) -> str | None:
    steps = _steps(spec, "pretokenizers")
    if not any(s.get("type") == "ByteLevel" for s in steps):
        return "pre_tokenizer: token offsets are implemented for byte-level BPE only (a ByteLevel pre-tokenizer)"
    for s in steps:
        if s.get("type") == "ByteLevel" and s.get("add_prefix_space", True):
            return "pre_tokenizer: ByteLevel add_prefix_space=true (a byte not in the text) has no offsets here"
        if s.get("type") == "Split" and s.get("behavior", "Removed") == "Removed":
            return "pre_tokenizer: Split behavior 'Removed' (drops text) has no offsets here"
    return None


def _normalizer_aligner(spec: dict | None) -> tuple[Aligner | None, str | None]:
    steps = _steps(spec, "normalizers")
    if not steps:
        return None, None
    if len(steps) == 1 and steps[0].get("type") in ("NFC", "NFKC", "NFD", "NFKD"):
        return _unicode_form_aligner(steps[0]["type"]), None
    kinds = [s.get("type") for s in steps]
    return None, f"normalizer {kinds}: token offsets are implemented for no normalizer or one Unicode normal form"


def _trim_setting(spec: dict | None) -> bool | None:
    for s in _steps(spec, "processors"):
        if s.get("type") == "ByteLevel" and s.get("trim_offsets", True):
            return bool(s.get("add_prefix_space", True))
    return None


def _unicode_form_aligner(form: str) -> Aligner:
    """Normalization replayed character by character to learn how many original characters each output character
    consumes (a decomposition's extra characters consume none, a composite what it absorbed; the counts travel
    with the characters through canonical reordering), then placed as tokenizers' `transform_range` places them.
    Checked against `unicodedata` at the end."""
    decompose_form = "NFKD" if form in ("NFKC", "NFKD") else "NFD"
    compose = form in ("NFC", "NFKC")

    def align(original: str, normalized: str) -> list[int]:
        stream: list[list] = []  # [character, consumed original characters]
        for ch in original:
            for k, d in enumerate(unicodedata.normalize(decompose_form, ch)):
                stream.append([d, 1 if k == 0 else 0])
        _reorder(stream)
        if compose:
            stream = _compose(stream)
        if "".join(c for c, _ in stream) != normalized:
            raise NotImplementedError(f"{form} offsets: replaying the normalization does not reproduce the text")
        out: list[int] = []
        at = 0
        for _, consumed in stream:
            # tokenizers' transform_range: an inserted character takes the original character before the current
            # position, whatever came out last
            out.append(at if consumed else max(at - 1, 0))
            at += consumed
        return out

    return align


def _reorder(stream: list[list]) -> None:
    """Canonical ordering: a run of non-starters sorted by combining class (stable)."""
    i = 0
    while i < len(stream):
        if not unicodedata.combining(stream[i][0]):
            i += 1
            continue
        j = i
        while j < len(stream) and unicodedata.combining(stream[j][0]):
            j += 1
        stream[i:j] = sorted(stream[i:j], key=lambda item: unicodedata.combining(item[0]))
        i = j


def _compose(stream: list[list]) -> list[list]:
    """Canonical composition (UAX #15): a character joins the last starter unless blocked."""
    out: list[list] = []
    starter = -1
    for ch, consumed in stream:
        ccc = unicodedata.combining(ch)
        if starter >= 0:
            last_ccc = unicodedata.combining(out[-1][0]) if len(out) - 1 > starter else None
            blocked = last_ccc is not None and (last_ccc == 0 or last_ccc >= ccc)
            if not blocked:
                pair = unicodedata.normalize("NFC", out[starter][0] + ch)
                if len(pair) == 1:
                    out[starter] = [pair, out[starter][1] + consumed]
                    continue
        if ccc == 0:
            starter = len(out)
        out.append([ch, consumed])
    return out


def byte_char_index(text: str) -> list[int]:
    """For each UTF-8 byte of `text`, the index of its character."""
    out: list[int] = []
    for i, ch in enumerate(text):
        n = 1 if ch < "\x80" else len(ch.encode("utf-8"))
        out.extend([i] * n)
    return out


def trim_offsets(tokens: list[str], spans: list[Span], add_prefix_space: bool) -> list[Span]:
    """tokenizers' ByteLevel `process_offsets`: leading/trailing space symbols leave a token's offsets."""
    out = []
    for i, (token, (start, end)) in enumerate(zip(tokens, spans)):
        lead = _count_spaces(token)
        trail = _count_spaces(token[::-1])
        if lead:
            if (i == 0 or start == 0) and add_prefix_space and lead == 1:
                lead = 0
            start = min(start + lead, end)
        if trail and end >= trail:
            end = max(end - trail, start)
        out.append((start, end))
    return out


def _count_spaces(token: str) -> int:
    n = 0
    for ch in token:
        if ch != _SPACE_SYMBOL and ch not in WHITE_SPACE:
            break
        n += 1
    return n


def overlap_mask(offsets: list[Span], spans: list[Span]) -> list[int]:
    """1 on each token whose offsets overlap one of the ordered character `spans` (transformers'
    `apply_chat_template(..., return_assistant_tokens_mask=True)` loop, span by span in one pass)."""
    mask = [0] * len(offsets)
    k = 0
    for t, (start, end) in enumerate(offsets):
        while k < len(spans) and start >= spans[k][1]:
            k += 1
        if k == len(spans):
            break
        if end > spans[k][0]:
            mask[t] = 1
    return mask
