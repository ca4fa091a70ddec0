"""Paths read from data files stay inside the folder they are joined with.

Two rules. A folder the user names (`--images`, `image_root`: `UserFolder`) is the user's own: ids and file
names are confined to it lexically (relative, no `..`), and symlinks inside it are followed. A folder pacs
reads back for a report (the run directory: `ConfinedRoot`) is strict, symlinks resolved:
a gallery entry's image, a results file or a log is joined with the run directory and must name something
*inside* it once every symlink is resolved (what `Path.resolve()` gives). `../x`, an absolute path elsewhere,
or a symlink in the folder that points outside it is refused before anything is looked up, with one message
that reads the same whether or not the outside path exists.

The resolution walks the path one component at a time, as `Path.resolve()` does, but stops at the first
component that lies outside the root (and is no ancestor of it): nothing outside the root is ever `lstat`-ed,
read or opened, so whether an outside file exists cannot leak through a message or a timing.
"""
from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path

from pacs.metric.common.errors import InputError

MAX_SYMLINKS = 40  # as Linux: more links followed while resolving one path is a loop


def _on_the_way(candidate: Path, root: Path) -> bool:
    """True when `candidate` is the root, below it, or one of its ancestors (the only places the walk looks at)."""
    return candidate.is_relative_to(root) or root.is_relative_to(candidate)


def resolve_within(root: Path, start: Path, parts: Sequence[str]) -> Path | None:
    """Resolve `start / parts` (symlinks included) from the resolved folder `start`; None as soon as it leaves
    the resolved `root` (nothing outside is looked at), on a symlink loop, or when it ends outside the root."""
    current = start
    pending = list(reversed(parts))
    links = 0
    while pending:
        part = pending.pop()
        if part in ("", "."):
            continue
        if part == "..":
            current = current.parent
            continue
        candidate = current / part
        if not _on_the_way(candidate, root):
            return None
        try:
            is_link = stat.S_ISLNK(os.lstat(candidate).st_mode)
        except (OSError, ValueError):  # missing (resolved as written, like Path.resolve), or an embedded NUL
            is_link = False
        if not is_link:
            current = candidate
            continue
        links += 1
        if links > MAX_SYMLINKS:
            return None
        try:
            target = Path(os.readlink(candidate))
        except OSError:
            return None
        if target.is_absolute():
            current = Path(target.anchor)
            pending.extend(reversed(target.parts[1:]))
        else:  # relative to the folder holding the link, which is `current`
            pending.extend(reversed(target.parts))
    return current if current != root and current.is_relative_to(root) else None


class ConfinedRoot:
    """A root folder that joined paths must stay inside (its resolved form is computed once)."""

    def __init__(self, root: str | os.PathLike, label: str | None = None) -> None:
        self.root = Path(root)
        #: how messages name the root (default: the folder itself)
        self.label = label if label is not None else str(self.root)
        try:
            self._resolved_root: Path | None = self.root.resolve()
        except (OSError, RuntimeError, ValueError):
            self._resolved_root = None

    def resolve(self, path: str | os.PathLike) -> Path | None:
        """`path` resolved (symlinks included) when that lies strictly below the root, else None."""
        if self._resolved_root is None:
            return None
        path = Path(path)
        try:
            relative = path.relative_to(self.root)  # lexically under the root as given: walk from its resolved form
        except ValueError:
            if path.is_absolute():
                return resolve_within(self._resolved_root, Path(path.anchor), path.parts[1:])
            return resolve_within(self._resolved_root, Path(os.getcwd()), path.parts)
        return resolve_within(self._resolved_root, self._resolved_root, relative.parts)

    def contains(self, path: str | os.PathLike) -> bool:
        """True when `path` resolves (symlinks included) to something strictly below the root."""
        return self.resolve(path) is not None

    def check(self, path: str | os.PathLike, what: str, parameter: str | Sequence[str] | None = None) -> Path:
        """`path` when it stays inside the root; else InputError `<what> must be a path inside <root>` (checked
        before any existence check; the message does not depend on whether the path exists)."""
        if not self.contains(path):
            raise InputError(f"{what} must be a path inside {self.label}", parameter=parameter)
        return Path(path)

    def join(self, relative: str | os.PathLike, what: str, parameter: str | Sequence[str] | None = None) -> Path:
        """`root / relative` when it stays inside the root; else the InputError of `check`."""
        return self.check(self.root / relative, what, parameter)


#: the rule of a folder the user names (`--images`, `image_root`), quoted by every refusal
USER_FOLDER_RULE = "a relative path without '..' (symlinks inside the folder are followed: the folder is yours)"


class UserFolder:
    """A folder the user names on the command line or in a config (`--images`, `image_root`): names are joined
    with it lexically (relative, no `..` component), and symlinks inside it are followed, wherever they point.

    The one lookup rule of every command that reads images by id or file name (`pacs score`, `evaluate`,
    `correlate`, `caption`, the data sets of `pacs train` and its rewards, `train-metric`). What pacs reads back
    from a run directory stays under the strict `ConfinedRoot` (symlinks resolved, nothing outside embedded).
    """

    def __init__(self, root: str | os.PathLike, label: str | None = None) -> None:
        self.root = Path(root)
        #: how messages name the folder (default: the folder itself)
        self.label = label if label is not None else str(self.root)

    def relative(self, name: str | os.PathLike) -> Path | None:
        """`name` as a relative path that stays inside the folder lexically, or None (absolute, a `..`
        component, empty, or an embedded NUL)."""
        text = os.fspath(name)
        if not text or "\0" in text or os.path.isabs(text):
            return None
        parts = [part for part in Path(text).parts if part not in ("", ".")]
        if not parts or ".." in parts:
            return None
        return Path(*parts)

    def join(self, relative: str | os.PathLike, what: str, parameter: str | Sequence[str] | None = None) -> Path:
        """`root / relative` when `relative` follows the rule; else InputError `<what> must be <the rule> inside
        <folder>` (before any existence check: the message never depends on what exists)."""
        inside = self.relative(relative)
        if inside is None:
            raise InputError(f"{what} must be a path inside {self.label}: {USER_FOLDER_RULE}", parameter=parameter)
        return self.root / inside


def path_inside(root: str | os.PathLike, relative: str | os.PathLike, what: str, label: str | None = None) -> Path:
    """`root / relative` when it resolves inside `root` (one-off `ConfinedRoot(root, label).join(relative, what)`)."""
    return ConfinedRoot(root, label).join(relative, what)


def user_path(root: str | os.PathLike, relative: str | os.PathLike, what: str, label: str | None = None) -> Path:
    """`root / relative` under the rule of a folder the user names (one-off `UserFolder(root, label).join`)."""
    return UserFolder(root, label).join(relative, what)
