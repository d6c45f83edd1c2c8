"""TOML in, frozen typed dataclasses out.

Each component owns a frozen dataclass; a stage config is a dataclass of component configs, one TOML table each.
Validation is strict (unknown keys, missing required keys and wrong types name the file, the table and the key),
and the resolved config serialises back to TOML byte-stably, because its digest is part of every stage's identity.

Supported field types: bool, int, float, str, `X | None`, `Literal[...]`, `tuple[X, ...]`, `list[X]`,
`dict[str, X]` and nested dataclasses. A `None` value is written to TOML by omission, so a field that may be None
must default to None."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Literal, Sequence, TypeVar, Union

from align.exceptions import ConfigError
from align.utils.fsio import atomic_write_text, sha256_bytes

T = TypeVar("T")
INCLUDE_KEY = "include"


# ---------------------------------------------------------------------------------------------------- reading

def read_toml(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict:
    """Parse a TOML file, resolving `include = "other.toml"` (relative to the file; the file's own values win)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    resolved = path.resolve()
    if resolved in _seen:
        raise ConfigError(f"{path}: include cycle: {' -> '.join(str(p) for p in (*_seen, resolved))}")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: malformed TOML: {exc}") from None
    includes = data.pop(INCLUDE_KEY, [])
    if isinstance(includes, str):
        includes = [includes]
    if not isinstance(includes, list) or not all(isinstance(i, str) for i in includes):
        raise ConfigError(f"{path}: top-level key 'include' must be a path string or a list of them")
    merged: dict = {}
    for inc in includes:
        merged = _deep_merge(merged, read_toml(path.parent / inc, (*_seen, resolved)))
    return _deep_merge(merged, data)


def _deep_merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def load_config(path: str | Path, cls: type[T], overrides: Sequence[str] = ()) -> T:
    """Load `path` into `cls`, applying `table.key=value` overrides typed by the target field."""
    data = read_toml(path)
    for item in overrides:
        data = apply_override(data, cls, item, source=str(path))
    return from_dict(cls, data, source=str(path))


def apply_override(data: dict, cls: type, item: str, source: str = "<override>") -> dict:
    """Return `data` with one `a.b.key=value` override applied; the value is parsed for the field's type."""
    if "=" not in item:
        raise ConfigError(f"override {item!r}: expected table.key=value")
    dotted, raw = item.split("=", 1)
    keys = dotted.strip().split(".")
    hint, table = _field_type_at(cls, keys, source)
    value = _parse_override_value(raw.strip(), hint, f"override {item!r}")
    out = json.loads(json.dumps(data))  # deep copy of plain TOML data
    node = out
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {item!r}: [{table}] is not a table in {source}")
    node[keys[-1]] = value
    return out


def _field_type_at(cls: type, keys: list[str], source: str) -> tuple[Any, str]:
    hint: Any = cls
    for depth, key in enumerate(keys):
        table = ".".join(keys[:depth]) or "<top>"
        base = _strip_optional(hint)
        if dataclasses.is_dataclass(base):
            fields = _hints(base)
            if key not in fields:
                raise ConfigError(f"{source}: [{table}] unknown key {key!r} in override; allowed: "
                                  f"{', '.join(sorted(fields))}")
            hint = fields[key]
        elif typing.get_origin(base) is dict:
            hint = typing.get_args(base)[1]
        else:
            raise ConfigError(f"{source}: [{table}] {keys[depth - 1]!r} is not a table; cannot set {key!r}")
    return hint, ".".join(keys[:-1]) or "<top>"


def _parse_override_value(raw: str, hint: Any, where: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        if _accepts_str(hint):
            return raw  # a bare word for a string field: `optimizer.name=adamw8bit`
        raise ConfigError(f"{where}: value {raw!r} is not a valid TOML value for type {_type_name(hint)}") from None


def _accepts_str(hint: Any) -> bool:
    base = _strip_optional(hint)
    return base is str or typing.get_origin(base) is Literal


# ---------------------------------------------------------------------------------------------------- typing

def _hints(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (Union, types.UnionType)


def _strip_optional(hint: Any) -> Any:
    if _is_union(hint):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


def _type_name(hint: Any) -> str:
    if isinstance(hint, type):
        return hint.__name__
    return str(hint).replace("typing.", "")


def from_dict(cls: type[T], data: dict, source: str = "<dict>", table: str = "<top>") -> T:
    """Build a dataclass from plain data, checking keys and types strictly."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: [{table}] expected a table, got {type(data).__name__}")
    hints = _hints(cls)
    unknown = sorted(set(data) - set(hints))
    if unknown:
        raise ConfigError(f"{source}: [{table}] unknown key {unknown[0]!r}; allowed keys: {', '.join(sorted(hints))}")
    kwargs = {}
    for field in dataclasses.fields(cls):
        if not field.init:
            continue
        if field.name in data:
            where = f"{table}.{field.name}" if table != "<top>" else field.name
            kwargs[field.name] = _coerce(data[field.name], hints[field.name], source, where)
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{source}: [{table}] missing required key {field.name!r} ({_type_name(hints[field.name])})")
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:  # __post_init__ validation of a component
        raise ConfigError(f"{source}: [{table}] {exc}") from None


def _coerce(value: Any, hint: Any, source: str, where: str) -> Any:
    def bad(expected: str) -> ConfigError:
        return ConfigError(f"{source}: {where}: expected {expected}, got {type(value).__name__} {value!r}")

    if _is_union(hint):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, arg, source, where)
            except ConfigError as exc:
                errors.append(exc)
        if len(errors) == 1:  # `X | None`: X's own error names the key that is wrong inside it
            raise errors[0]
        raise bad(_type_name(hint))
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, source, where)
    if origin is Literal:
        if value not in typing.get_args(hint):
            raise bad("one of " + ", ".join(repr(a) for a in typing.get_args(hint)))
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise bad(_type_name(hint))
        args = typing.get_args(hint)
        item = args[0] if args else Any
        items = [_coerce(v, item, source, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise bad(_type_name(hint))
        vtype = typing.get_args(hint)[1]
        return {str(k): _coerce(v, vtype, source, f"{where}.{k}") for k, v in value.items()}
    if hint is Any:
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise bad("bool")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad("int")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad("float")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise bad("str")
        return value
    raise ConfigError(f"{source}: {where}: unsupported config field type {_type_name(hint)}")


# ---------------------------------------------------------------------------------------------------- writing

def to_dict(cfg: Any) -> dict:
    """Plain nested dict of a config dataclass (tuples become lists, None fields are dropped)."""
    out = {}
    for field in dataclasses.fields(cfg):
        value = _plain(getattr(cfg, field.name))
        if value is not None:
            out[field.name] = value
    return out


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return to_dict(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items() if v is not None}
    return value


def to_toml(cfg: Any) -> str:
    """Serialise a config to TOML: same config, same bytes (field order, fixed float and string formatting)."""
    return toml_text(to_dict(cfg))


def toml_text(data: dict, sort_keys: bool = False) -> str:
    """Serialise plain TOML data (as `read_toml` returns it) byte-stably; `sort_keys` also makes key order moot."""
    lines: list[str] = []
    _emit_table(_sorted(data) if sort_keys else data, [], lines)
    return "\n".join(lines).strip() + "\n"


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def _emit_table(table: dict, path: list[str], lines: list[str]) -> None:
    scalars = {k: v for k, v in table.items() if not isinstance(v, dict)}
    subtables = {k: v for k, v in table.items() if isinstance(v, dict)}
    if path and (scalars or not subtables):
        lines.append("")
        lines.append("[" + ".".join(_key(p) for p in path) + "]")
    for key, value in scalars.items():
        lines.append(f"{_key(key)} = {_value(value)}")
    for key, value in subtables.items():
        _emit_table(value, [*path, key], lines)


def _key(key: str) -> str:
    if key and all(c.isalnum() or c in "-_" for c in key):
        return key
    return json.dumps(key, ensure_ascii=False)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        text = repr(value)
        return text if any(c in text for c in ".en") else text + ".0"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, (datetime.date, datetime.time)):  # TOML dates and times (datetime is a date)
        return value.isoformat()
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def config_digest(cfg: Any) -> str:
    return sha256_bytes(to_toml(cfg).encode("utf-8"))


# ---------------------------------------------------------------------------------------------------- workers

RESOLVED_CONFIG = "resolved_config.toml"
RUN_DIR_ENV = "ALIGN_RUN_DIR"


def load_cli_config(cls: type[T], argv: Sequence[str] | None = None, prog: str | None = None) -> T:
    """A stage worker's command line: `--config FILE [table.key=value ...]` -> a validated `cls`."""
    parser = argparse.ArgumentParser(prog=prog, description=f"{cls.__name__} from TOML plus overrides")
    parser.add_argument("--config", required=True, help="stage config TOML")
    parser.add_argument("overrides", nargs="*", help="table.key=value, typed by the field")
    ns = parser.parse_args(argv)
    return load_config(ns.config, cls, ns.overrides)


def run_dir_from_env(fallback: str | Path) -> Path:
    """The stage's run directory: `$ALIGN_RUN_DIR` under the pipeline's launcher, else `fallback`."""
    return Path(os.environ.get(RUN_DIR_ENV) or fallback)


def write_resolved_config(cfg: Any, run_dir: str | Path) -> Path:
    """`<run_dir>/resolved_config.toml`, atomically: the config the worker really ran with, defaults included."""
    path = Path(run_dir) / RESOLVED_CONFIG
    atomic_write_text(path, to_toml(cfg))
    return path
