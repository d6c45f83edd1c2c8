"""The GPT-2 byte-to-unicode alphabet used by byte-level BPE (GPT-2, Llama-3, OLMo/GPT-NeoX tokenizer.json).

Every byte maps to one printable character so that a BPE vocabulary of strings can cover all of UTF-8 without
control characters or spaces in its pieces. The table is the one `tokenizers` (and GPT-2's encoder.py) uses:
printable Latin-1 bytes map to themselves, the other 68 bytes to U+0100 upwards, in byte order.
"""

from __future__ import annotations

# The pattern the `ByteLevel` pre-tokenizer splits with when `use_regex` is true (Oniguruma syntax; translated
# by align.tokenizer.unicode_regex before use).
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


def _bytes_to_unicode() -> list[str]:
    printable = set(range(ord("!"), ord("~") + 1)) | set(range(ord("¡"), ord("¬") + 1))
    printable |= set(range(ord("®"), ord("ÿ") + 1))
    table: list[str] = []
    extra = 0
    for b in range(256):
        if b in printable:
            table.append(chr(b))
        else:
            table.append(chr(256 + extra))
            extra += 1
    return table


BYTE_TO_CHAR: list[str] = _bytes_to_unicode()
CHAR_TO_BYTE: dict[str, int] = {c: b for b, c in enumerate(BYTE_TO_CHAR)}


def bytes_to_symbols(text: str) -> str:
    """UTF-8 bytes of `text`, each replaced by its alphabet character."""
    table = BYTE_TO_CHAR
    return "".join([table[b] for b in text.encode("utf-8")])


def symbols_to_bytes(token: str) -> bytes:
    """Inverse of bytes_to_symbols for one token. A token holding a character outside the alphabet (an added
    token such as `<|endoftext|>` with a non-Latin-1 character) contributes its raw UTF-8 bytes instead, as the
    `tokenizers` ByteLevel decoder does."""
    table = CHAR_TO_BYTE
    out = bytearray()
    for ch in token:
        b = table.get(ch)
        if b is None:
            return token.encode("utf-8")
        out.append(b)
    return bytes(out)
