"""Reading helpers shared by the caption loaders: JSON with located errors, typed key access."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from metric.common.errors import InputError


def read_json(path: Path) -> Any:
    """Parse a JSON file; a syntax error names the file, line and column."""
    if not path.is_file():
        raise InputError(f"{path}: file not found")
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except json.JSONDecodeError as error:
        raise InputError(f"{path}: line {error.lineno} column {error.colno}: invalid JSON: {error.msg}") from None
    except UnicodeDecodeError as error:
        raise InputError(f"{path}: not UTF-8 text ({error.reason})") from None


def require(mapping: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    """Return `mapping[key]` checked against `kind`; InputError naming `where` and the key otherwise."""
    if not isinstance(mapping, dict):
        raise InputError(f"{where}: expected an object, got {type(mapping).__name__}")
    if key not in mapping:
        raise InputError(f"{where}: missing key {key!r}")
    value = mapping[key]
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise InputError(f"{where}.{key}: expected {_kind_name(kind)}, got a boolean")
    if not isinstance(value, kind):
        raise InputError(f"{where}.{key}: expected {_kind_name(kind)}, got {type(value).__name__}")
    return value


def nonempty_caption(text: Any, where: str) -> str:
    """Return a stripped caption string; an empty or non-string caption is an InputError naming `where`."""
    if not isinstance(text, str):
        raise InputError(f"{where}: caption must be a string, got {type(text).__name__}")
    text = text.strip()
    if not text:
        raise InputError(f"{where}: empty caption")
    return text


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {"str": "a string", "int": "an integer", "list": "a list", "dict": "an object", "bool": "a boolean"}
    return " or ".join(names.get(k.__name__, k.__name__) for k in kinds)
