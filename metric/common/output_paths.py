"""Outputs never replace inputs: the one check every command makes on its output paths before any work (issue 41).

`check_outputs` refuses, in one InputError naming the flag and the path, an output (`--out`, `--csv`, `--html`,
`--latex`, `--markdown`, `--plot`, a report file) that is the same file as one of the command's inputs (after
resolving links: `os.path.samefile`, hard links included), that is an existing file inside a folder the command
reads (an image, a video frame, a checkpoint or benchmark file), or that another output of the same run names too.
`check_unnamed_output` guards a derived output the user did not name (the CSV `pacs evaluate` writes next to its
`--out`): it is written only where nothing exists yet. `model_inputs` lists the files and folders the model options
(`--checkpoint`, `--backbone`, `--arch`, `--cache-dir`, `--metric-model`) read, `path_inputs` those of a flag that
takes a file or a folder.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pacs.metric.common.errors import InputError

PathLike = str | os.PathLike
#: (what names the path in a message: a flag such as ``--out``, or ``the image of 'a'``; the path, or None)
Named = tuple[str, "PathLike | None"]

_NEVER = "an output never replaces an input; nothing was written: choose another path"


def same_file(first: PathLike, second: PathLike) -> bool:
    """True when the two paths are one file (links and hard links resolved; by their real paths when one is absent)."""
    try:
        return os.path.samefile(first, second)
    except (OSError, ValueError):
        return os.path.realpath(first) == os.path.realpath(second)


def _inside(path: PathLike, folder: PathLike) -> bool:
    """True when `path` resolves to the folder `folder` or to something under it."""
    real, root = os.path.realpath(path), os.path.realpath(folder)
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def _present(items: Iterable[Named]) -> list[tuple[str, PathLike]]:
    """The items whose path is given (not None, not empty)."""
    return [(name, path) for name, path in items if path is not None and str(path) != ""]


@dataclass(frozen=True)
class Folder:
    """A folder the command reads: `name` names it in messages (``--images``); with `suffixes`, only its files of
    those suffixes are inputs (images in an image folder), else every file under it is (a checkpoint folder)."""

    name: str
    path: PathLike | None
    suffixes: tuple[str, ...] | None = None

    def holds(self, out: PathLike) -> bool:
        """True when the output `out` would replace a file this folder gives the command (or is the folder)."""
        if self.path is None or str(self.path) == "" or not os.path.isdir(self.path) or not _inside(out, self.path):
            return False
        if same_file(out, self.path):
            return True
        return os.path.lexists(out) and (self.suffixes is None or Path(out).suffix.lower() in self.suffixes)


def check_outputs(outputs: Iterable[Named], inputs: Iterable[Named] = (), folders: Iterable[Folder] = ()) -> None:
    """InputError naming the first output that is an input file, a file an input folder gives the command, or
    another output's path; nothing is written or read here beyond `os.stat`."""
    outputs, inputs = _present(outputs), _present(inputs)
    for index, (flag, out) in enumerate(outputs):
        for name, path in inputs:
            if same_file(out, path):
                where = "" if str(out) == str(path) else f" ({path})"
                raise InputError(f"{flag} {out} is the input file of {name}{where}: {_NEVER}")
        for folder in folders:
            if not folder.holds(out):
                continue
            if same_file(out, folder.path):
                raise InputError(f"{flag} {out} is the input folder of {folder.name}: {_NEVER}")
            raise InputError(f"{flag} {out} is an existing file in {folder.path}, the input folder of {folder.name} "
                             f"(this command reads it): {_NEVER}")
        for other_flag, other in outputs[:index]:
            if same_file(out, other):
                raise InputError(f"{flag} {out} is also the {other_flag} output: each output needs its own path; "
                                 "nothing was written")


def check_unnamed_output(path: PathLike, what: str, hint: str) -> None:
    """InputError when `path`, an output the user did not name (`what`: "the CSV written next to --out t.json"),
    exists already (a file, a folder or a link): such a file is never overwritten; `hint` says how to name it."""
    if os.path.lexists(path):
        raise InputError(f"{path} exists and is {what}, not an output you named: it is never overwritten and nothing "
                         f"was written; {hint}")


def _existing(value: Any) -> Path | None:
    """`value` as a path when it names an existing file or folder, else None."""
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        return None
    path = Path(value)
    try:
        return path if path.exists() else None
    except (OSError, ValueError):
        return None


def _sort(name: str, value: Any, files: list[Named], folders: list[Folder],
          suffixes: tuple[str, ...] | None = None) -> None:
    """Put `value` (when it exists) in `files`, or as a `Folder` (of `suffixes`) in `folders`, under `name`."""
    path = _existing(value)
    if path is None:
        return
    if path.is_dir():
        folders.append(Folder(name, path, suffixes))
    else:
        files.append((name, path))


def model_inputs(args: Any) -> tuple[list[Named], list[Folder]]:
    """(files, folders) that the model options of `args` (a namespace or mapping) read: `--checkpoint`, `--arch`,
    the FILE or local-dir FOLDER of `--backbone`, `--cache-dir`, and the SOURCE / arch FILE of `--metric-model`."""
    get = args.get if isinstance(args, Mapping) else (lambda key, default=None: getattr(args, key, default))
    files: list[Named] = []
    folders: list[Folder] = []
    _sort("--checkpoint", get("checkpoint"), files, folders)
    _sort("--arch", get("arch"), files, folders)
    backbone = get("backbone")
    if isinstance(backbone, str) and backbone:
        if backbone.startswith("local-dir:"):
            _sort("--backbone", backbone[len("local-dir:"):], files, folders)
        else:
            _sort("--backbone", backbone, files, folders)
            if "/" in backbone:
                _sort("--backbone", backbone.split("/", 1)[1], files, folders)
    _sort("--cache-dir", get("cache_dir"), files, folders, (".npy",))  # the cached embeddings
    for spec in get("metric_model") or ():
        _, _, rest = str(spec).partition("=")
        for index, part in enumerate(rest.split(",")):
            if index == 0:
                _sort("--metric-model", part, files, folders)
            elif part.startswith("arch="):
                _sort("--metric-model", part[len("arch="):], files, folders)
    return files, folders


def path_inputs(name: str, value: Any, suffixes: tuple[str, ...] | None = None) -> tuple[list[Named], list[Folder]]:
    """(files, folders) of one input flag whose value is a file or a folder (`--data DIR|FILE`; a folder's inputs
    are its files of `suffixes`, every file when None); both empty when absent."""
    files: list[Named] = []
    folders: list[Folder] = []
    _sort(name, value, files, folders, suffixes)
    return files, folders
