"""Added tokens (tokenizer.json `added_tokens`): found in the text before normalization and never split by BPE.

tokenizers finds them with a leftmost-longest Aho-Corasick automaton; here a regex built from a trie of the
token strings does the same (the scan is leftmost, and at each node the greedy optional tail prefers the longer
token). Tokens with `normalized: false` are matched on the raw text, those with `normalized: true` on each
normalized segment, as tokenizers does. `special` tokens are matched only when the caller asks
(`parse_special=True`); non-special added tokens are always matched (tokenizers' `encode_special_tokens` flag
has the same scope).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from align.exceptions import ArtifactError

Segment = tuple[str, int | None]  # (text, None) or (token content, token id)


@dataclass(frozen=True)
class AddedToken:
    id: int
    content: str
    special: bool
    normalized: bool


def parse_added_tokens(raw: list, source: str) -> list[AddedToken]:
    tokens = []
    for n, item in enumerate(raw):
        for flag in ("lstrip", "rstrip", "single_word"):
            if item.get(flag):
                raise NotImplementedError(f"{source}: added_tokens[{n}] ({item.get('content')!r}) sets {flag}=true")
        if not isinstance(item.get("content"), str) or not isinstance(item.get("id"), int) or not item["content"]:
            raise ArtifactError(f"{source}: added_tokens[{n}] needs a non-empty string 'content' and an int 'id'")
        tokens.append(AddedToken(item["id"], item["content"], bool(item.get("special", False)),
                                 bool(item.get("normalized", not item.get("special", False)))))
    return tokens


def trie_regex(words: list[str]) -> re.Pattern[str] | None:
    """A regex matching any of `words`, leftmost then longest."""
    if not words:
        return None
    trie: dict = {}
    for word in words:
        node = trie
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}

    def build(node: dict) -> str:
        alternatives = [re.escape(ch) + build(child) for ch, child in sorted(node.items()) if ch]
        if not alternatives:
            return ""
        body = alternatives[0] if len(alternatives) == 1 else "(?:" + "|".join(alternatives) + ")"
        return f"(?:{body})?" if "" in node else body

    return re.compile(build(trie))


class AddedVocab:
    def __init__(self, tokens: list[AddedToken]):
        self.by_content = {t.content: t.id for t in tokens}
        self.special_ids = frozenset(t.id for t in tokens if t.special)
        raw = [t for t in tokens if not t.normalized]
        norm = [t for t in tokens if t.normalized]
        # (parse_special=False, parse_special=True) -> matcher, for each of the two passes
        self._raw = (trie_regex([t.content for t in raw if not t.special]), trie_regex([t.content for t in raw]))
        self._norm = (trie_regex([t.content for t in norm if not t.special]), trie_regex([t.content for t in norm]))

    def has_normalized(self, parse_special: bool) -> bool:
        return self._norm[parse_special] is not None

    def split_raw(self, text: str, parse_special: bool) -> list[Segment]:
        return self._split(text, self._raw[parse_special])

    def split_normalized(self, text: str, parse_special: bool) -> list[Segment]:
        return self._split(text, self._norm[parse_special])

    def _split(self, text: str, regex: re.Pattern[str] | None) -> list[Segment]:
        if regex is None:
            return [(text, None)]
        out: list[Segment] = []
        prev = 0
        for m in regex.finditer(text):
            start, end = m.span()
            if start > prev:
                out.append((text[prev:start], None))
            out.append((m.group(), self.by_content[m.group()]))
            prev = end
        if prev < len(text) or not out:
            out.append((text[prev:], None))
        return out
