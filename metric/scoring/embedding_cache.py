"""Persistent image-embedding cache on disk, keyed by model fingerprint + image file hash (`--cache-dir`).

Layout: `DIR/<fingerprint[:32]>/<sha256 of the image file>.npy` (an L2-normalised fp32 vector) plus
`DIR/<fingerprint[:32]>/model.json` naming the model. Entries are written atomically, so concurrent runs and
interrupted runs never leave a half-written entry; a corrupt entry is reported and recomputed.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np

from pacs.metric.common.io import atomic_path, write_json_atomic
from pacs.metric.common.provenance import sha256_file

logger = logging.getLogger(__name__)

FINGERPRINT_CHARS = 32


class EmbeddingCache:
    """Image embeddings of one model on disk, looked up by the sha256 of the image file's bytes."""

    def __init__(self, cache_dir: str | os.PathLike, fingerprint: str, model_name: str = "") -> None:
        self.root = Path(cache_dir) / fingerprint[:FINGERPRINT_CHARS]
        self.root.mkdir(parents=True, exist_ok=True)
        self.fingerprint = fingerprint
        self.hits = 0
        self.misses = 0
        info = self.root / "model.json"
        if not info.exists():
            write_json_atomic(info, {"fingerprint": fingerprint, "name": model_name})
        self._file_hashes: dict[str, str] = {}

    def file_hash(self, path: str | os.PathLike) -> str:
        """sha256 of an image file, memoised by resolved path + size + mtime (a changed file is hashed again)."""
        key = image_identity(path)
        if key not in self._file_hashes:
            self._file_hashes[key] = sha256_file(path)
        return self._file_hashes[key]

    def _entry(self, file_hash: str) -> Path:
        return self.root / f"{file_hash}.npy"

    def get(self, file_hash: str) -> np.ndarray | None:
        """Return the cached embedding for a file hash, or None."""
        entry = self._entry(file_hash)
        if not entry.is_file():
            self.misses += 1
            return None
        try:
            value = np.load(entry, allow_pickle=False)
        except (OSError, ValueError) as error:
            logger.warning("ignoring corrupt cache entry %s (%s)", entry, error)
            self.misses += 1
            return None
        self.hits += 1
        return value

    def put(self, file_hash: str, embedding: np.ndarray) -> None:
        """Store one embedding (fp32) atomically."""
        with atomic_path(self._entry(file_hash)) as tmp, open(tmp, "wb") as handle:
            np.save(handle, np.asarray(embedding, dtype=np.float32), allow_pickle=False)

    def __len__(self) -> int:
        return sum(1 for _ in self.root.glob("*.npy"))

    def describe(self) -> str:
        """One line for logs: where the cache is and its hit/miss counts."""
        return f"embedding cache {self.root}: {self.hits} hits, {self.misses} misses"

    @staticmethod
    def read_model_info(folder: str | os.PathLike) -> dict:
        """Read the `model.json` of a cache folder."""
        return json.loads((Path(folder) / "model.json").read_text(encoding="utf-8"))


def image_identity(path: str | os.PathLike) -> str:
    """`path:<realpath>|<size>|<mtime_ns>`: the in-memory cache key of an image file (a changed file gets a new key).

    A missing file keeps its resolved path as key (loading it then fails with an error naming it).
    """
    resolved = os.path.realpath(path)
    try:
        stat = os.stat(resolved)
    except OSError:
        return f"path:{resolved}"
    return f"path:{resolved}|{stat.st_size}|{stat.st_mtime_ns}"
