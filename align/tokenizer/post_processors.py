"""tokenizer.json `post_processor` -> what `add_special_tokens=True` adds around one sequence of ids."""

from __future__ import annotations

from collections.abc import Callable

from align.tokenizer.compose import pipe

PostProcessor = Callable[[list[int]], list[int]]


def _identity(ids: list[int]) -> list[int]:
    return ids


def build_post_processor(spec: dict | None, where: str) -> PostProcessor:
    if spec is None:
        return _identity
    kind = spec.get("type")
    if kind == "Sequence":
        return pipe([build_post_processor(s, f"{where}.processors[{i}]")
                     for i, s in enumerate(spec["processors"])] or [_identity])
    if kind == "ByteLevel":
        return _identity  # it only trims offsets; ids are untouched
    if kind == "TemplateProcessing":
        return _template(spec, where)
    raise NotImplementedError(f"{where}: post_processor type {kind!r} is not supported by align.tokenizer")


def _template(spec: dict, where: str) -> PostProcessor:
    specials = {name: list(entry["ids"]) for name, entry in spec.get("special_tokens", {}).items()}
    before: list[int] = []
    after: list[int] = []
    seen_sequence = False
    for n, item in enumerate(spec["single"]):
        if "Sequence" in item:
            if item["Sequence"]["id"] != "A" or seen_sequence:
                raise NotImplementedError(f"{where}.single[{n}]: only one sequence 'A' is supported")
            seen_sequence = True
        elif "SpecialToken" in item:
            name = item["SpecialToken"]["id"]
            if name not in specials:
                raise NotImplementedError(f"{where}.single[{n}]: special token {name!r} missing from special_tokens")
            (after if seen_sequence else before).extend(specials[name])
        else:
            raise NotImplementedError(f"{where}.single[{n}]: template item {item!r}")
    return lambda ids: before + ids + after
