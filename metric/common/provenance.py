"""Provenance carried by every output JSON: pacs version, model hash, w, config, seed."""
from __future__ import annotations

import hashlib
import os
import platform
from importlib import metadata
from typing import Any


def pacs_version() -> str:
    """Return the installed pacs-captioning version (or 'unknown' when running from a bare checkout)."""
    try:
        return metadata.version("pacs-captioning")
    except metadata.PackageNotFoundError:
        return "unknown"


def sha256_file(path: str | os.PathLike, chunk_size: int = 1 << 20) -> str:
    """Return the hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(chunk_size), b""):
            digest.update(block)
    return digest.hexdigest()


def provenance(**fields: Any) -> dict[str, Any]:
    """Return a provenance record: pacs version, python/torch versions, plus the given fields."""
    record: dict[str, Any] = {"pacs_version": pacs_version(), "python": platform.python_version()}
    try:
        import torch

        record["torch"] = torch.__version__
    except ImportError:  # pragma: no cover - torch is a hard dependency
        pass
    record.update(fields)
    return record
