"""Reading the `images` array of a large annotation file one element at a time, so that parsing never holds the
whole file's objects at once (a COCO Karpathy file is a few hundred thousand small objects).

`stream_array(path, key)` yields the elements of `{"<key>": [...], ...}` parsed one by one from the file's text
with the standard library's decoder (`json.JSONDecoder.raw_decode`, the same parser as `json.loads`); the rest
of the object is checked once the array is read. A file of any other shape, one with a `\\uD800`-style escape
(which the full reader checks) or a syntax error anywhere goes through `read_json` instead, whose one located
InputError is then what the caller gets.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from captioner.data.parsing import read_json, require
from metric.common.errors import InputError

_WHITESPACE = re.compile(r"[ \t\n\r]*")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def stream_array(path: Path, key: str) -> Iterator[Any]:
    """The elements of the top-level `key` array of JSON file `path`, parsed one at a time (see the module)."""
    try:
        text = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        text = None
    start = re.compile(r'[ \t\n\r]*\{[ \t\n\r]*"' + re.escape(key) + r'"[ \t\n\r]*:[ \t\n\r]*\[').match(text or "")
    if text is None or start is None or _SURROGATE_ESCAPE.search(text):
        yield from require(read_json(path), key, list, str(path))
        return
    decoder = json.JSONDecoder()
    position = start.end()
    try:
        position = _WHITESPACE.match(text, position).end()
        if text[position:position + 1] == "]":
            position += 1
        else:
            while True:
                element, position = decoder.raw_decode(text, _WHITESPACE.match(text, position).end())
                yield element
                position = _WHITESPACE.match(text, position).end()
                if text[position:position + 1] == "]":
                    position += 1
                    break
                if text[position:position + 1] != ",":
                    raise json.JSONDecodeError("Expecting ',' delimiter", text, position)
                position += 1
        json.loads("{" + f'"{key}": []' + text[position:])  # the rest of the top-level object is valid JSON
    except (json.JSONDecodeError, RecursionError, ValueError):
        del text
        read_json(path)  # raises the located InputError of the full reader
        raise InputError(f"{path}: invalid JSON") from None
