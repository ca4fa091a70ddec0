"""Operating-system failures a user can fix (a full disk, a read-only or unwritable folder) as one clear line."""
from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Iterator
from pathlib import Path

_DISK_FULL = "free some disk space (or write to another disk) and run again"
_RESUMES = "; finished work is kept and an interrupted stage resumes or restarts"
FIXES = {
    errno.ENOSPC: _DISK_FULL,
    errno.EDQUOT: _DISK_FULL,
    errno.EROFS: "the file system is read-only: choose a folder on a writable one",
    errno.EACCES: "make it accessible to this user, or choose another folder",
    errno.EPERM: "make it accessible to this user, or choose another folder",
    errno.ENOTDIR: "a part of that path is a file, not a folder: remove it or choose another path",
    errno.EISDIR: "that path is a folder where a file was expected: remove it or choose another path",
    errno.ENAMETOOLONG: "choose a shorter path",
}


def describe_os_error(error: OSError, resumable: bool = False) -> str | None:
    """One line naming the file, the failure and its fix; None for failures that are not the user's to fix.

    `resumable`: the command keeps finished stages (`pacs train`, `train-metric`), so a full disk's line says that
    a new run resumes; a one-shot command (score, evaluate, report) just names the file it could not write.
    """
    fix = FIXES.get(error.errno)
    if fix is None:
        return None
    if fix == _DISK_FULL and resumable:
        fix += _RESUMES
    where = " and ".join(str(name) for name in (error.filename, error.filename2) if name is not None)
    what = error.strerror or str(error)
    return f"{where}: {what}; {fix}" if where else f"{what}; {fix}"


def user_error_line(error: BaseException, resumable: bool = False) -> str | None:
    """The one line a script prints for a user error (PacsError or a fixable OSError), its user text escaped
    (`pacs.metric.common.terminal.escape_control`); None for anything else."""
    from pacs.metric.common.errors import PacsError
    from pacs.metric.common.terminal import escape_control

    if isinstance(error, PacsError):
        return escape_control(str(error))
    os_error = error if isinstance(error, OSError) else os_error_of(error)
    line = describe_os_error(os_error, resumable) if os_error is not None else None
    return None if line is None else escape_control(line)


_OS_ERROR_CODE = re.compile(r"\(os error (\d+)\)")
_AT_PATH = re.compile(r' at path "(.+)"\Z')


def os_error_of(error: BaseException, path: str | os.PathLike | None = None) -> OSError | None:
    """The OSError inside a safetensors `SafetensorError` (`... (os error 28) at path "..."`, what `save_file`
    raises on a full disk), naming `path` or else the folder of the file it was writing; None for anything else."""
    match = _OS_ERROR_CODE.search(str(error))
    if type(error).__name__ != "SafetensorError" or match is None:
        return None
    code = int(match.group(1))
    if path is None:
        at = _AT_PATH.search(str(error))
        written = Path(at.group(1)) if at else None  # safetensors' own temporary file: name its folder
        path = (written.parent if written.name.startswith(".tmp") else written) if written else None
    return OSError(code, os.strerror(code), None if path is None else str(path))


@contextlib.contextmanager
def writing_to(path: str | os.PathLike) -> Iterator[None]:
    """Name `path` in a write failure of the block: an OSError without a file name, or a safetensors
    `SafetensorError` carrying an operating-system error (a full disk while `save_file` writes), becomes an OSError
    with that errno and `path`, which `describe_os_error` turns into one line."""
    try:
        yield
    except OSError as error:
        if error.filename is not None or error.errno is None:
            raise
        raise OSError(error.errno, error.strerror or os.strerror(error.errno), str(path)) from error
    except Exception as error:
        os_error = os_error_of(error, path)
        if os_error is None:
            raise
        raise os_error from error
