"""Operating-system failures a user can fix (a full disk, a read-only or unwritable folder) as one clear line."""
from __future__ import annotations

import errno

_DISK_FULL = ("free some disk space (or write to another disk) and run again; finished work is kept and an "
              "interrupted stage resumes or restarts")
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


def describe_os_error(error: OSError) -> str | None:
    """One line naming the file, the failure and its fix; None for failures that are not the user's to fix."""
    fix = FIXES.get(error.errno)
    if fix is None:
        return None
    where = " and ".join(str(name) for name in (error.filename, error.filename2) if name is not None)
    what = error.strerror or str(error)
    return f"{where}: {what}; {fix}" if where else f"{what}; {fix}"


def user_error_line(error: BaseException) -> str | None:
    """The one line a script prints for a user error (PacsError or a fixable OSError); None for anything else."""
    from metric.common.errors import PacsError

    if isinstance(error, PacsError):
        return str(error)
    return describe_os_error(error) if isinstance(error, OSError) else None
