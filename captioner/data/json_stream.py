"""Reading the `images` array of a large annotation file one element at a time, so that parsing never holds the
whole file's objects at once (a COCO Karpathy file is a few hundred thousand small objects).

`stream_array(path, key)` yields the elements of `{"<key>": [...], ...}` parsed one by one from the file's text
with the standard library's decoder (`json.JSONDecoder.raw_decode`, the same parser as `json.loads`); the rest
of the object is checked once the array is read. A file of any other shape, one with a `\\uD800`-style escape
(which the full reader checks) or a syntax error anywhere goes through `read_json` instead, whose one located
InputError is then what the caller gets.
"""
from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pacs.captioner.data.parsing import read_json, require
from pacs.metric.common.errors import InputError

_WHITESPACE = re.compile(r"[ \t\n\r]*")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
CHUNK_BYTES = 1 << 20  # bytes read at a time
HEAD_CHARS = 1 << 16  # characters where the array must open


def stream_array(path: Path, key: str) -> Iterator[Any]:
    """The elements of the top-level `key` array of JSON file `path`, parsed one at a time (see the module)."""
    start = re.compile(r'[ \t\n\r]*\{[ \t\n\r]*"' + re.escape(key) + r'"[ \t\n\r]*:[ \t\n\r]*\[')
    if not _streamable(path, start):
        yield from require(read_json(path), key, list, str(path))
        return
    try:
        yield from _elements(path, key, start)
    except (json.JSONDecodeError, RecursionError, ValueError):
        read_json(path)  # raises the located InputError of the full reader
        raise InputError(f"{path}: invalid JSON") from None


def _streamable(path: Path, start: re.Pattern) -> bool:
    """Whether `path` is UTF-8 text that opens with the array and holds no `\\uD8xx`-style escape (read in
    chunks: a few bytes of the file in memory at a time)."""
    utf8 = codecs.getincrementaldecoder("utf-8")()
    head, tail = "", ""
    try:
        with open(path, "rb") as handle:
            while chunk := handle.read(CHUNK_BYTES):
                decoded = utf8.decode(chunk)
                if _SURROGATE_ESCAPE.search(tail + decoded):
                    return False
                tail = (tail + decoded)[-5:]  # an escape split between two chunks
                head += decoded[:max(HEAD_CHARS - len(head), 0)]
            utf8.decode(b"", final=True)
    except (OSError, UnicodeDecodeError):
        return False
    return start.match(head) is not None


def _elements(path: Path, key: str, start: re.Pattern) -> Iterator[Any]:
    """The array's elements, decoded from a text buffer refilled chunk by chunk and cut behind the last element
    (so the buffer holds about one chunk, whatever the file's size); then the rest of the object is checked."""
    decoder = json.JSONDecoder()
    utf8 = codecs.getincrementaldecoder("utf-8")()
    with open(path, "rb") as handle:
        buffer, at_end = "", False

        def refill(at_least: int = CHUNK_BYTES) -> None:
            nonlocal buffer, at_end
            chunk = handle.read(max(at_least, CHUNK_BYTES))
            at_end = not chunk
            buffer += utf8.decode(chunk, final=at_end)

        while len(buffer) < HEAD_CHARS and not at_end:
            refill()
        opening = start.match(buffer)
        if opening is None:
            raise ValueError("the array's opening moved")
        position = opening.end()
        expect_element, count = True, 0
        while True:
            position = _WHITESPACE.match(buffer, position).end()
            if position >= len(buffer) and not at_end:
                refill()
                continue
            if buffer[position:position + 1] == "]":
                if expect_element and count:
                    raise json.JSONDecodeError("Expecting value", buffer, position)  # `[..., ]`
                position += 1
                break
            if not expect_element:
                if buffer[position:position + 1] != ",":
                    raise json.JSONDecodeError("Expecting ',' delimiter", buffer, position)
                position += 1
                expect_element = True
                continue
            try:
                element, end = decoder.raw_decode(buffer, _WHITESPACE.match(buffer, position).end())
            except (json.JSONDecodeError, RecursionError):
                if at_end:
                    raise
                refill(len(buffer))  # the element goes on in the next chunk (doubling: a long one costs O(size))
                continue
            if end >= len(buffer) and not at_end:  # a number could go on in the next chunk
                refill()
                continue
            yield element
            position, expect_element, count = end, False, count + 1
            if position > CHUNK_BYTES:  # what is decoded goes
                buffer, position = buffer[position:], 0
        while not at_end:
            refill()
        json.loads("{" + f'"{key}": []' + buffer[position:])  # the rest of the top-level object is valid JSON
