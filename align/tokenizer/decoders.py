"""tokenizer.json `decoder` -> a function list[token string] -> str, following tokenizers' `decode_chain`
semantics: each decoder maps the token list to a new token list, and the final list is concatenated."""

from __future__ import annotations

from collections.abc import Callable

from align.tokenizer.byte_level import symbols_to_bytes
from align.tokenizer.compose import pipe

Chain = Callable[[list[str]], list[str]]


def build_decoder(spec: dict | None, where: str) -> Callable[[list[str]], str]:
    if spec is None:
        # tokenizers joins tokens with a space when a tokenizer has no decoder
        return " ".join
    step = _build_step(spec, where)
    return lambda tokens: "".join(step(tokens))


def _build_step(spec: dict, where: str) -> Chain:
    kind = spec.get("type")
    if kind == "Sequence":
        return pipe([_build_step(s, f"{where}.decoders[{i}]") for i, s in enumerate(spec["decoders"])])
    if kind == "Replace":
        pattern = spec["pattern"]
        if "String" not in pattern:
            raise NotImplementedError(f"{where}: Replace decoder with pattern {pattern!r}")
        old, new = pattern["String"], spec["content"]
        return lambda tokens: [t.replace(old, new) for t in tokens]
    if kind == "ByteFallback":
        return _byte_fallback
    if kind == "Fuse":
        return lambda tokens: ["".join(tokens)]
    if kind == "Strip":
        return _strip(spec["content"], int(spec.get("start", 0)), int(spec.get("stop", 0)))
    if kind == "ByteLevel":
        return lambda tokens: [b"".join(symbols_to_bytes(t) for t in tokens).decode("utf-8", errors="replace")]
    raise NotImplementedError(f"{where}: decoder type {kind!r} is not supported by align.tokenizer")


def _byte_value(token: str) -> int | None:
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        try:
            return int(token[3:5], 16)
        except ValueError:
            return None
    return None


def _byte_fallback(tokens: list[str]) -> list[str]:
    """Runs of `<0xXX>` tokens become their UTF-8 text; a run that is not valid UTF-8 becomes one U+FFFD per
    byte (tokenizers replaces the whole run, where sentencepiece would keep the valid parts)."""
    out: list[str] = []
    pending = bytearray()

    def flush() -> None:
        if pending:
            try:
                out.append(pending.decode("utf-8"))
            except UnicodeDecodeError:
                out.extend("\ufffd" for _ in pending)
            pending.clear()

    for token in tokens:
        value = _byte_value(token)
        if value is not None:
            pending.append(value)
            continue
        flush()
        out.append(token)
    flush()
    return out


def _strip(content: str, start: int, stop: int) -> Chain:
    def run(tokens: list[str]) -> list[str]:
        out = []
        for token in tokens:
            begin = 0
            while begin < min(start, len(token)) and token[begin] == content:
                begin += 1
            end = len(token)
            while len(token) - end < stop and end > begin and token[end - 1] == content:
                end -= 1
            out.append(token[begin:end])
        return out

    return run
