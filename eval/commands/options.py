"""Command-line flags from option dataclasses (one source of truth) and parsed flags back into them."""
from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any


def _value_type(hint: Any) -> Any:
    """The type argparse converts a flag's value to (`int | None` -> int)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        inner = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return inner[0] if len(inner) == 1 else str
    return hint


def add_dataclass_options(container: Any, cls: type) -> list[str]:
    """Add a ``--name`` flag per field of the dataclass `cls` (type, default, help and metavar from the field).

    A ``bool`` field becomes a ``store_true`` flag. A flag the parser already has (another benchmark's
    options with the same name) is kept as it is. Returns the names of the flags added.
    """
    hints = typing.get_type_hints(cls)
    added = []
    for option in dataclasses.fields(cls):
        flag = "--" + option.name.replace("_", "-")
        if flag in container._option_string_actions:
            continue
        default = option.default if option.default is not dataclasses.MISSING else option.default_factory()
        kind = _value_type(hints[option.name])
        keywords: dict[str, Any] = {"dest": option.name, "help": option.metadata.get("help")}
        if kind is bool:
            container.add_argument(flag, action="store_true", **keywords)
        else:
            if option.metadata.get("metavar"):
                keywords["metavar"] = option.metadata["metavar"]
            container.add_argument(flag, type=kind, default=default, **keywords)
        added.append(option.name)
    return added


def dataclass_from_args(cls: type, args: argparse.Namespace) -> Any:
    """The dataclass `cls` from parsed flags (fields the namespace lacks keep their defaults)."""
    values = {option.name: getattr(args, option.name) for option in dataclasses.fields(cls)
              if hasattr(args, option.name)}
    return cls(**values)
