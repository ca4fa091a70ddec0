"""Configuration as dataclasses loaded from YAML with `_base_` inheritance and `key=value` overrides.

A YAML file may name `_base_: other.yaml` (relative to itself, or a list of files); its keys are merged
recursively over the base. Overrides use dotted keys (`xe.max_steps=100`) and YAML-typed values.
"""
from __future__ import annotations

import dataclasses
import os
import typing
from pathlib import Path
from typing import Any, Mapping, Sequence, TypeVar

import yaml

from metric.common.errors import InputError

T = TypeVar("T")


def deep_merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """Return `base` with `update` merged in recursively (dicts merge, everything else replaces)."""
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_yaml(path: str | os.PathLike, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Load a YAML config, resolving `_base_` files recursively (cycles are an error)."""
    path = Path(path).resolve()
    if path in _seen:
        raise InputError(f"{path}: _base_ cycle through {' -> '.join(map(str, _seen))}")
    if not path.is_file():
        raise InputError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as error:
        raise InputError(f"{path}: invalid YAML: {error}") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: a config must be a mapping at the top level")
    bases = data.pop("_base_", None) or []
    if isinstance(bases, str):
        bases = [bases]
    merged: dict[str, Any] = {}
    for base in bases:
        merged = deep_merge(merged, load_yaml(path.parent / base, _seen + (path,)))
    return deep_merge(merged, data)


def parse_overrides(overrides: Sequence[str]) -> dict[str, Any]:
    """Turn `a.b=value` strings into a nested dict; values are parsed as YAML scalars/lists."""
    result: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise InputError(f"override {item!r} is not of the form key=value")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        node = result
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return result


def _resolve_type(tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin is typing.Union or (origin is not None and str(origin) == "<class 'types.UnionType'>"):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else tp
    return tp


def from_dict(cls: type[T], data: Mapping[str, Any], where: str = "config") -> T:
    """Build dataclass `cls` from a mapping; unknown keys are an error naming the key."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls} is not a dataclass")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in (data or {}).items():
        if key not in fields:
            raise InputError(f"{where}: unknown key {key!r} (known: {', '.join(sorted(fields))})")
        field_type = _resolve_type(hints[key])
        if dataclasses.is_dataclass(field_type) and isinstance(value, Mapping):
            default = getattr(cls(), key) if _has_all_defaults(cls) else None
            base = dataclasses.asdict(default) if default is not None else {}
            value = from_dict(field_type, deep_merge(base, value), f"{where}.{key}")
        kwargs[key] = value
    return cls(**kwargs)


def _has_all_defaults(cls: type) -> bool:
    return all(f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
               for f in dataclasses.fields(cls))


def load_config(cls: type[T], path: str | os.PathLike | None = None, overrides: Sequence[str] = ()) -> T:
    """Load dataclass `cls` from an optional YAML file plus `key=value` overrides."""
    data = load_yaml(path) if path else {}
    data = deep_merge(data, parse_overrides(overrides))
    return from_dict(cls, data)


def to_dict(config: Any) -> dict[str, Any]:
    """Return a dataclass config as a plain dict (for provenance and saving)."""
    return dataclasses.asdict(config)


def dump_yaml(config: Any, path: str | os.PathLike) -> None:
    """Write a dataclass config as YAML atomically."""
    from metric.common.io import write_text_atomic

    write_text_atomic(path, yaml.safe_dump(to_dict(config), sort_keys=False))
