"""Frozen-dataclass configs to and from JSON-like dicts, with errors that name the bad field."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A config dict does not match its dataclass."""


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def from_dict(cls: type[T], data: Any, path: str = "config") -> T:
    """Builds `cls` from `data`, recursing into nested dataclasses; tuples from lists."""
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected an object, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{path}: unknown field(s) {', '.join(unknown)}")
    kwargs = {k: _convert(hints[k], v, f"{path}.{k}") for k, v in data.items()}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{path}: {e}") from e


def _convert(tp: Any, value: Any, path: str) -> Any:
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, path)
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(f"{path}: {value!r} is not one of {list(typing.get_args(tp))}")
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{path}: expected a list, got {type(value).__name__}")
        (inner, *_) = typing.get_args(tp) or (Any,)
        return tuple(_convert(inner, v, path) for v in value)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(tp):
            return None
        inner = next(a for a in typing.get_args(tp) if a is not type(None))
        return _convert(inner, value, path)
    if tp is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if (
        tp in (int, float, bool, str)
        and not isinstance(value, tp)
        or (tp is int and isinstance(value, bool))
    ):
        raise ConfigError(f"{path}: expected {tp.__name__}, got {value!r}")
    return value


def override(cfg: T, assignments: list[str]) -> T:
    """`a.b.c=value` (value parsed as JSON, else kept as a string) applied to the dataclass `cfg`;
    `ValueError` names an unknown field."""
    doc = to_dict(cfg)
    for item in assignments:
        key, _, raw = item.partition("=")
        *path, leaf = key.split(".")
        node = doc
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or leaf not in node:
            raise ValueError(f"unknown config field {key!r}")
        try:
            node[leaf] = json.loads(raw)
        except ValueError:
            node[leaf] = raw
    return from_dict(type(cfg), doc)
