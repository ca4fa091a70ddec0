"""Reading helpers shared by the caption loaders: JSON with located errors, typed key access, image paths that
stay inside the image root."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pacs.metric.common.contained_paths import UserFolder
from pacs.metric.common.errors import InputError
from pacs.metric.common.json_input import read_json_file


def read_json(path: Path) -> Any:
    """Parse a JSON file; a syntax error names the file, line and column; nesting too deep, bytes that are not
    UTF-8 and strings that are not valid Unicode text (lone surrogates) are InputErrors naming the file."""
    if not path.is_file():
        raise InputError(f"{path}: file not found")
    return read_json_file(path, "annotation")


def confined_root(root: str | os.PathLike) -> UserFolder:
    """The image root that every image file name of an annotation file stays inside lexically (no `..`, not
    absolute; symlinks inside it are followed: the rule of `--images`, `pacs.metric.common.contained_paths.UserFolder`)."""
    return UserFolder(root, f"the image root {root}")


def image_file(root: UserFolder, name: str | os.PathLike, where: str) -> Path:
    """`root / name`; InputError `<where>: image file <name> must be a path inside the image root <root>: <rule>`
    when it leaves the root lexically (`../x`, an absolute path), before any existence check."""
    return root.join(name, f"{where}: image file {str(name)!r}")


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
