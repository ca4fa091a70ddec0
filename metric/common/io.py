"""Atomic file output: write to a temporary file in the target folder, then rename (no partial outputs).

Every file written here gets the mode a plain ``open(path, "w")`` would give it, ``0o666 & ~umask`` (temporary
files are private, 0600, until they are renamed into place). JSON output is strict: NaN and ±Infinity are not
JSON, so `write_json_atomic` refuses them, naming the file and the key path of the first one; a value that is
legitimately missing (an undefined correlation, an unavailable metric) is written as ``null``
(`finite_or_none`, `nonfinite_to_none`).
"""
from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import tempfile
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pacs.metric.common.errors import InputError, NonFiniteError
from pacs.metric.common.os_errors import writing_to

_UMASK_LOCK = threading.Lock()
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def current_umask() -> int:
    """The process's umask, read without changing it where possible (Linux: the `Umask:` of /proc/self/status).

    Elsewhere it falls back to `os.umask` set-and-restore under a lock (process-global: another thread creating
    a file at that very moment could see umask 0o077 briefly, never a laxer one).
    """
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status", encoding="ascii",
                                                         errors="replace") as handle:
        for line in handle:
            if line.startswith("Umask:"):
                return int(line.split(":", 1)[1].strip(), 8)
    with _UMASK_LOCK:
        umask = os.umask(0o077)
        os.umask(umask)
    return umask


def chmod_like_umask(path: str | os.PathLike, umask: int | None = None) -> None:
    """Give `path` (and, for a folder, everything under it) the mode plain `open()`/`mkdir()` would give it."""
    path = Path(path)
    umask = current_umask() if umask is None else umask
    for item in [path, *path.rglob("*")] if path.is_dir() and not path.is_symlink() else [path]:
        if not item.is_symlink():
            os.chmod(item, (0o777 if item.is_dir() else 0o666) & ~umask)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to `path`; rename it onto `path` only if the block succeeds.

    The file renamed into place has mode ``0o666 & ~umask`` (like a plain `open()`), not mkstemp's 0600.
    """
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # a part of the folder path is a file: one line naming it (os_errors), not a traceback
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(target.parent)) from None
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        with writing_to(target):  # a full disk while the block writes names `path`
            yield tmp
        chmod_like_umask(tmp)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()


def _key_path(parent: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{parent}[{key}]"
    text = str(key)
    if _IDENTIFIER.match(text):
        return f"{parent}.{text}" if parent else text
    return f"{parent}[{json.dumps(text, ensure_ascii=False)}]"


def first_nonfinite(data: Any, where: str = "") -> tuple[str, float] | None:
    """The key path (``rows[2].C``, ``"$"`` for the top level) and value of the first NaN/±inf float in `data`."""
    if isinstance(data, float):
        return None if math.isfinite(data) else (where or "$", data)
    if isinstance(data, Mapping):
        items: Any = data.items()
    elif isinstance(data, (list, tuple)):
        items = enumerate(data)
    else:
        return None
    for key, value in items:
        found = first_nonfinite(value, _key_path(where, key))
        if found is not None:
            return found
    return None


def finite_or_none(value: Any) -> float | None:
    """`value` as a float, or None (JSON null) when it is missing, NaN or infinite."""
    if value is None:
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def nonfinite_to_none(data: Any) -> Any:
    """A copy of `data` (dicts, lists, tuples) with every NaN/±inf float replaced by None (JSON null).

    For outputs where a non-finite number legitimately means "undefined" (a correlation of constant scores, a
    metric that could not be computed); numpy scalars become Python numbers.
    """
    if isinstance(data, Mapping):
        return {key: nonfinite_to_none(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [nonfinite_to_none(value) for value in data]
    if hasattr(data, "dtype") and hasattr(data, "tolist"):  # numpy scalars and arrays (without importing numpy)
        return nonfinite_to_none(data.tolist())
    if isinstance(data, float):
        return finite_or_none(data)
    return data


def check_json_finite(data: Any, path: str | os.PathLike) -> None:
    """NonFiniteError naming `path` and the key path when `data` holds NaN or ±Infinity (which JSON has not)."""
    found = first_nonfinite(data)
    if found is not None:
        where, value = found
        raise NonFiniteError(f"{path}: refusing to write {value} at {where}: JSON has no NaN/Infinity (a missing "
                             "value must be null; a non-finite result usually means a diverged model or "
                             "non-finite weights)")


def write_json_atomic(path: str | os.PathLike, data: Any, indent: int | None = 2) -> None:
    """Serialise `data` as strict JSON into `path` atomically (NonFiniteError on NaN/inf: no file is written)."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as handle:
        try:
            json.dump(data, handle, indent=indent, ensure_ascii=False, allow_nan=False)
        except ValueError as error:
            if "float" not in str(error):
                raise
            check_json_finite(data, path)  # only on failure: find the key path of the first non-finite number
            raise NonFiniteError(f"{path}: refusing to write a non-JSON number ({error})") from None
        handle.write("\n")


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write `text` into `path` atomically."""
    with atomic_path(path) as tmp:
        Path(tmp).write_text(text, encoding="utf-8")


#: first characters that make a spreadsheet read a cell as a formula (the OWASP CSV-injection rule)
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def replace_marked_block(text: str, begin: str, end: str, content: str, name: str) -> str:
    """`text` with the part between its one `begin` and one `end` marker replaced by `content` (a generated block
    of a docs page); an `InputError` naming `name` when the markers are missing, repeated or out of order."""
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise InputError(f"{name}: expected one {begin} ... {end} block")
    head, rest = text.split(begin)
    _, tail = rest.split(end)
    return f"{head}{begin}\n{content}\n{end}{tail}"


def csv_cell(value: Any) -> Any:
    """`value` for a CSV cell pacs writes: a string starting with ``= + - @``, a tab or a carriage return that is
    not a number (``-0.5`` stays a number) gets a leading ``'``, so a spreadsheet shows it as text, never as a
    formula (`+HYPERLINK(...)` in a system name); anything else is returned as it is."""
    if not isinstance(value, str) or not value.startswith(_FORMULA_STARTS):
        return value
    try:
        float(value)
    except ValueError:
        return "'" + value
    return value


def csv_cells(row: Any) -> Any:
    """A CSV row (a sequence of cells or a DictWriter mapping) with every cell passed through `csv_cell`."""
    if isinstance(row, Mapping):
        return {key: csv_cell(value) for key, value in row.items()}
    return [csv_cell(value) for value in row]
