"""Reading user JSON files: every way a file can be bad is one InputError naming the file (and where in it).

`read_json_file(path, what)` turns a missing file, an unreadable one, bytes that are not UTF-8, malformed JSON
(with its line and column), JSON nested too deeply for Python's parser (a `RecursionError` otherwise) and
numbers too long to convert into `InputError`s. It also refuses any string (value or key) holding a lone
surrogate (JSON `"\\ud800"`): such a string cannot be written as UTF-8 or tokenized, so it is refused when
read, naming where it is (`images[3].sentences[0].raw`). Readers that name the item better themselves (a
caption by its image id) pass `check_strings=False` and call `check_text` per item. An object that repeats a key
(`{"ID": "first", "ID": "second"}`, which `json.loads` would settle silently by keeping the last) is refused,
naming the key and the file (`unique_keys`, the `object_pairs_hook` of every parse here).
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from pacs.metric.common.errors import InputError

_SURROGATE = re.compile("[\ud800-\udfff]")
# A lone surrogate can only come from a \uD800-\uDFFF escape in the JSON text (strict UTF-8 decoding refuses
# encoded surrogates), so files without one are not walked.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def lone_surrogate(text: str) -> int | None:
    """The position of the first lone surrogate code point in `text`, or None when it is valid Unicode text."""
    match = _SURROGATE.search(text)
    return match.start() if match else None


def check_text(text: str, what: str) -> str:
    """Return `text`; InputError `<what> is not valid Unicode text (lone surrogate at position N)` otherwise."""
    position = lone_surrogate(text)
    if position is not None:
        raise InputError(f"{what} is not valid Unicode text (lone surrogate at position {position})")
    return text


class DuplicateKeyError(ValueError):
    """A JSON object repeats a key (`key`); `parse_json_text` turns it into an InputError naming the file."""

    def __init__(self, key: str) -> None:
        super().__init__(f"duplicate key {key!r}")
        self.key = key


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """`object_pairs_hook` for `json.loads`: the object as a dict; DuplicateKeyError when a key is repeated."""
    data = dict(pairs)
    if len(data) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKeyError(key)
            seen.add(key)
    return data


def shown_key(key: str, limit: int = 80) -> str:
    """`key` as a JSON string for a message (escaped, ASCII-safe), its middle cut beyond `limit` characters."""
    text = json.dumps(key)
    return text if len(text) <= limit else f"{text[:limit // 2]}...{text[-limit // 2:]}"


def _child(where: str, key: Any) -> str:
    """The location of `key` under `where`: `a.b`, `a[3]`, `a["odd key"]` (keys printed ASCII-safe)."""
    if isinstance(key, int):
        return f"{where}[{key}]"
    if _IDENTIFIER.match(key):
        return f"{where}.{key}" if where else key
    return f"{where}[{json.dumps(key)}]"


def first_invalid_text(data: Any) -> tuple[str, int] | None:
    """(location, position) of the first string or key of `data` holding a lone surrogate; None when none does.

    The location is `"$"` for the top-level value, `images[3].caption` for a value, and `key ... of <object>`
    for a key. Walks iteratively, so any nesting depth is fine.
    """
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, str):
            position = lone_surrogate(value)
            if position is not None:
                return where or "$", position
        elif isinstance(value, dict):
            children = []
            for key, item in value.items():
                position = lone_surrogate(key)
                if position is not None:
                    return f"a key of {where or 'the top-level object'}", position
                children.append((_child(where, key), item))
            stack.extend(reversed(children))
        elif isinstance(value, list):
            stack.extend(reversed([(_child(where, index), item) for index, item in enumerate(value)]))
    return None


def parse_json_text(text: str, source: str, what: str = "JSON", check_strings: bool = True) -> Any:
    """Parse JSON `text` read from `source` (a file name for messages); the errors of `read_json_file` (a key
    repeated in one object included)."""
    try:
        data = json.loads(text, object_pairs_hook=unique_keys)
    except DuplicateKeyError as error:
        raise InputError(f"{source}: the key {shown_key(error.key)} appears twice in one object of the {what} file "
                         "(JSON keys must be unique: which value is meant?)") from None
    except json.JSONDecodeError as error:
        raise InputError(f"{source}: line {error.lineno} column {error.colno}: invalid JSON: {error.msg} "
                         f"(malformed JSON in the {what} file)") from None
    except RecursionError:
        raise InputError(f"{source}: the {what} file is JSON nested too deeply to read "
                         "(arrays / objects nested hundreds of levels deep)") from None
    except ValueError as error:  # e.g. an integer longer than Python converts (4300 digits)
        raise InputError(f"{source}: invalid JSON in the {what} file: {str(error).splitlines()[0]}") from None
    if check_strings and _SURROGATE_ESCAPE.search(text):
        found = first_invalid_text(data)
        if found is not None:
            where, position = found
            raise InputError(f"{source}: {where} is not valid Unicode text (lone surrogate at position {position})")
    return data


def read_json_file(path: str | os.PathLike, what: str = "JSON", check_strings: bool = True) -> Any:
    """Parse the JSON file `path` (`what` names it in messages: "candidates", "gallery"); one InputError naming
    the file for a missing or unreadable file, non-UTF-8 bytes, malformed JSON (line and column), nesting too
    deep, a key repeated in one object, and (unless `check_strings` is False) a string or key holding a lone surrogate."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{what} file not found: {path}")
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise InputError(f"{path}: cannot read the {what} file ({error.strerror or error})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InputError(f"{path}: not UTF-8 text (byte {error.start}: {error.reason})") from None
    return parse_json_text(text, str(path), what, check_strings)
