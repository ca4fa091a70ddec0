"""What a finished stage made, recorded so that a later run can verify it before reusing the stage.

Every regular file under a stage's outputs is listed with its size and a content digest: the sha256 of the whole
file up to `FULL_HASH_BYTES`, and beyond that a sampled sha256 (the size, the first and last MiB and 32 blocks of
64 KiB spread evenly), so that verifying a large feature-shard set costs a few MiB of reads per file. A missing,
truncated, grown or rewritten file, or a new file in a folder, fails the check. Symbolic links are recorded by
their target text and never followed.
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

FULL_HASH_BYTES = 256 * 1024 * 1024
_EDGE = 1024 * 1024
_BLOCK = 64 * 1024
_BLOCKS = 32


def file_digest(path: Path, size: int) -> str:
    """sha256 of the file (`full:`), or of sampled pieces of it beyond FULL_HASH_BYTES (`sampled:`)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        if size <= FULL_HASH_BYTES:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
            return "full:" + digest.hexdigest()
        digest.update(str(size).encode())
        offsets = [0, size - _EDGE, *[(size - _BLOCK) * i // (_BLOCKS - 1) for i in range(_BLOCKS)]]
        for offset in offsets:
            handle.seek(offset)
            digest.update(handle.read(_EDGE if offset in (0, size - _EDGE) else _BLOCK))
    return "sampled:" + digest.hexdigest()


def _entries(path: Path) -> dict[str, Path]:
    """The files (and links) that make up one output: itself, or everything below a folder."""
    if path.is_symlink() or path.is_file():
        return {"": path}
    if not path.is_dir():
        return {}
    found = {}
    for root, folders, files in os.walk(path):
        folders.sort()
        for name in sorted(files) + [f for f in folders if (Path(root) / f).is_symlink()]:
            child = Path(root) / name
            found[child.relative_to(path).as_posix()] = child
    return found


def _describe(path: Path) -> dict[str, Any]:
    if path.is_symlink():
        return {"link": os.readlink(path)}
    size = path.stat().st_size
    return {"size": size, "digest": file_digest(path, size)}


def output_manifest(outputs: Sequence[Path], run_dir: Path) -> dict[str, dict[str, Any]]:
    """{output path relative to the run dir: {file below it: size and digest}} for every output that exists."""
    manifest: dict[str, dict[str, Any]] = {}
    for output in outputs:
        key = _relative(output, run_dir)
        if output.exists() or output.is_symlink():
            manifest[key] = {name: _describe(file) for name, file in _entries(output).items()}
    return manifest


def _relative(path: Path, run_dir: Path) -> str:
    try:
        return path.relative_to(run_dir).as_posix()
    except ValueError:
        return str(path)


def _where(output: str, name: str) -> str:
    return f"{output}/{name}" if name else output


def manifest_problems(manifest: Mapping[str, Any], outputs: Sequence[Path], run_dir: Path,
                      limit: int = 3) -> list[str]:
    """What differs between the recorded manifest and the files now (empty: the outputs are as they were made)."""
    problems: list[str] = []
    for output in outputs:
        key = _relative(output, run_dir)
        recorded = manifest.get(key)
        if not isinstance(recorded, Mapping):
            if output.exists():
                problems.append(f"{key} was not recorded")
            continue
        now = _entries(output)
        for name, entry in recorded.items():
            file = now.pop(name, None)
            where = _where(key, name)
            if file is None:
                problems.append(f"{where} is missing")
            elif not isinstance(entry, Mapping):
                problems.append(f"{where}: unreadable record")
            elif "link" in entry:
                if not file.is_symlink() or os.readlink(file) != entry["link"]:
                    problems.append(f"{where} changed")
            elif file.is_symlink() or not file.is_file():
                problems.append(f"{where} is no longer a regular file")
            else:
                size = file.stat().st_size
                if size != entry.get("size"):
                    problems.append(f"{where} changed size ({entry.get('size')} -> {size} bytes)")
                elif file_digest(file, size) != entry.get("digest"):
                    problems.append(f"{where} changed content")
        problems += [f"{_where(key, name)} was added" for name in sorted(now)]
        if len(problems) >= limit:
            break
    return problems[:limit]
