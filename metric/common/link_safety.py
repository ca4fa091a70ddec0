"""Nothing outside a run directory is written through a link planted in it.

Files that pacs writes in place (the run lock, CSV logs, shard files it appends to) are opened with `O_NOFOLLOW`
and checked to be plain files with one name (a hard link to a file elsewhere is written just like a symbolic
one); files written atomically (`pacs.metric.common.io.atomic_path`) are renamed onto their name, which replaces a
link instead of writing through it. Folders that pacs writes into inside a run directory are checked with
`lstat`, component by component from the run directory down (`check_no_links`).
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import IO, Any

from pacs.metric.common.errors import InputError

_FLAGS = {"w": os.O_WRONLY, "a": os.O_WRONLY | os.O_APPEND, "r+": os.O_RDWR}


def link_error(path: str | os.PathLike, what: str = "a symbolic link") -> InputError:
    """The one-line refusal of a path that is a link (or not a plain file / folder)."""
    return InputError(f"{path} is {what}: pacs never writes through a link in a run directory (remove it)")


def open_no_follow(path: str | os.PathLike, mode: str = "w", **kwargs: Any) -> IO[Any]:
    """`open(path, mode)` for writing ("w", "a", "r+", text or binary) that never follows a link at `path`.

    The file is created (mode 0o666 & ~umask) when missing; "w" truncates only after the checks. InputError
    naming the path for a symbolic link, a hard-linked file or anything but a plain file.
    """
    base = mode.replace("b", "").replace("t", "")
    if base not in _FLAGS:
        raise ValueError(f"open_no_follow: unsupported mode {mode!r}")
    try:
        fd = os.open(path, _FLAGS[base] | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o666)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise link_error(path) from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise link_error(path, "not a regular file")
        if info.st_nlink != 1:
            raise link_error(path, f"a file with {info.st_nlink} hard links")
        os.set_blocking(fd, True)
        if base == "w":
            os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, mode, **kwargs)  # no second open: "w" here truncates nothing


def check_no_links(root: str | os.PathLike, path: str | os.PathLike) -> None:
    """InputError when a component of `path` below `root` (the run directory) is a symbolic link.

    `root` itself may be a link (the user chose it); a `path` outside `root` is not checked.
    """
    root, path = Path(root), Path(path)
    try:
        parts = path.relative_to(root).parts
    except ValueError:
        return
    current = root
    for part in parts:
        current = current / part
        if current.is_symlink():
            raise link_error(current)
