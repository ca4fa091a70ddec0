"""Inputs are regular files (or folders): a FIFO, a socket or a device named as an input is refused before it is
opened, since reading one blocks forever (a FIFO nobody writes) or never ends (`/dev/zero`)."""
from __future__ import annotations

import os
import stat
from collections.abc import Sequence

from pacs.metric.common.errors import InputError

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def special_kind(path: str | os.PathLike) -> str | None:
    """What `path` is when it exists (links followed) and is neither a regular file nor a folder, else None."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):  # missing, unreadable or an embedded NUL: the caller's own error applies
        return None
    return next((kind for test, kind in _KINDS if test(mode)), None)


def refuse_special(path: str | os.PathLike, what: str, parameter: str | Sequence[str] | None = None) -> None:
    """InputError `<what> <path> is a FIFO ...` when `path` is neither a regular file nor a folder."""
    kind = special_kind(path)
    if kind is not None:
        raise InputError(f"{what} {os.fspath(path)} is {kind}, not a regular file: pacs reads only regular files "
                         "and folders", parameter=parameter)
