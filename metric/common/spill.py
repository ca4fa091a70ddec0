"""Large per-item tables kept on disk instead of in memory: arrays and strings in unnamed temporary files, read
with `os.pread` on access.

A training set's captions, token ids and image ids grow with the data set; kept in memory they make a process's
size grow with N. Here they live in files (`tempfile.TemporaryFile`: no name, removed by the kernel when the
process ends, however it ends), written once, then read item by item (one `pread` per read, no memory map: the
pages read are the kernel's page cache, not the process's memory). What stays in memory is fixed-size buffers and,
for `IdLookup`, 12 bytes per id.

* `DiskArray(dtype)` — a 1-D numpy array: `extend` while writing, then `finish()`; `a[i]`, `a[i:j]`, `a[rows]`.
* `DiskStrings()` — strings: `append` while writing, then `finish()`; `s[i]`, iteration in blocks.
* `IdLookup(strings)` — position of an id among `DiskStrings` (sorted 64-bit hashes, verified against the strings).
"""
from __future__ import annotations

import hashlib
import itertools
import os
import struct
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

WRITE_BUFFER = 1 << 18  # bytes gathered in memory before one write
READ_BLOCK = 1 << 16  # items read per block when iterating an array
STRING_BLOCK = 1 << 12  # strings read per block when iterating strings


class DiskArray:
    """A 1-D array of `dtype` in an unnamed temporary file: `extend` then `finish`, then read by index."""

    def __init__(self, dtype: Any, folder: str | os.PathLike | None = None) -> None:
        self.dtype = np.dtype(dtype)
        self._file = tempfile.TemporaryFile(dir=None if folder is None else Path(folder))  # noqa: SIM115 - owned
        self._fd = self._file.fileno()
        self._buffer = bytearray()  # what is not written yet (at most WRITE_BUFFER bytes: no object per item)
        packer = struct.Struct("@" + self.dtype.char) if self.dtype.char in "bBhHiIlLqQ?fd" else None
        self._pack = packer.pack if packer is not None and packer.size == self.dtype.itemsize else None
        self._written = 0
        self._length = 0
        self.finished = False

    def _check_open(self) -> None:
        if self.finished:
            raise RuntimeError("DiskArray is finished: it cannot grow")

    def append(self, value: Any) -> None:
        """Append one value (cast to this array's dtype)."""
        self._check_open()
        if self._pack is None:
            self._buffer += np.asarray(value, dtype=self.dtype).reshape(1).tobytes()
        else:
            self._buffer += self._pack(value)
        self._length += 1
        if len(self._buffer) >= WRITE_BUFFER:
            self._flush()

    def extend(self, values: Any) -> None:
        """Append `values` (anything `np.asarray` takes; cast to this array's dtype)."""
        self._check_open()
        data = np.ascontiguousarray(np.asarray(values, dtype=self.dtype).reshape(-1))
        self._buffer += data.tobytes()
        self._length += len(data)
        if len(self._buffer) >= WRITE_BUFFER:
            self._flush()

    def extend_bytes(self, data: bytes) -> None:
        """Append raw bytes (a uint8 array's values)."""
        if self.dtype != np.uint8:
            raise TypeError("extend_bytes needs a uint8 DiskArray")
        self._check_open()
        self._buffer += data
        self._length += len(data)
        if len(self._buffer) >= WRITE_BUFFER:
            self._flush()

    def _flush(self) -> None:
        view = memoryview(self._buffer)
        while view:
            written = os.pwrite(self._fd, view, self._written)
            self._written += written
            view = view[written:]
        view.release()
        self._buffer = bytearray()

    def finish(self) -> DiskArray:
        """Write what is pending; the array is read-only from now on (returns itself)."""
        if not self.finished:
            self._flush()
            self.finished = True
        return self

    def __len__(self) -> int:
        return self._length

    def _read(self, start: int, stop: int) -> np.ndarray:
        if not self.finished:
            raise RuntimeError("DiskArray is not finished: call finish() before reading")
        size = self.dtype.itemsize
        want = (stop - start) * size
        data = os.pread(self._fd, want, start * size) if want else b""
        if len(data) != want:
            raise OSError(f"spill file truncated: read {len(data)} of {want} bytes")
        return np.frombuffer(data, dtype=self.dtype)

    def read_bytes(self, start: int, stop: int) -> bytes:
        """Items `start:stop` of a uint8 array as bytes."""
        if not self.finished:
            raise RuntimeError("DiskArray is not finished: call finish() before reading")
        data = os.pread(self._fd, stop - start, start) if stop > start else b""
        if len(data) != max(stop - start, 0):
            raise OSError(f"spill file truncated: read {len(data)} of {stop - start} bytes")
        return data

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._length)
            if step == 1:
                return self._read(start, max(start, stop))
            rows = np.arange(start, stop, step)
            return self.take(rows)
        if isinstance(index, (int, np.integer)):
            position = int(index) + self._length if index < 0 else int(index)
            if not 0 <= position < self._length:
                raise IndexError(f"index {index} out of range for {self._length} items")
            return self._read(position, position + 1)[0]
        return self.take(index)

    def take(self, rows: Any) -> np.ndarray:
        """Items at `rows` (integer array-like, any order, repeats allowed)."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        if len(rows) == 0:
            return np.empty(0, dtype=self.dtype)
        rows = np.where(rows < 0, rows + self._length, rows)
        if rows.min() < 0 or rows.max() >= self._length:
            raise IndexError(f"index out of range for {self._length} items")
        low, high = int(rows.min()), int(rows.max()) + 1
        if high - low <= 4 * len(rows) + 1024:  # one read of the span covering every row
            return self._read(low, high)[rows - low].copy()
        return np.array([self._read(int(r), int(r) + 1)[0] for r in rows], dtype=self.dtype)

    def blocks(self, block: int = READ_BLOCK) -> Iterator[np.ndarray]:
        """The whole array, `block` items at a time."""
        for start in range(0, self._length, block):
            yield self._read(start, min(start + block, self._length))

    def to_numpy(self) -> np.ndarray:
        """The whole array in memory (a copy)."""
        return self._read(0, self._length).copy()

    def close(self) -> None:
        """Delete the file (the kernel frees it)."""
        self._file.close()

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("a DiskArray lives in an unnamed file of its process and cannot be pickled")


class DiskStrings:
    """Strings in an unnamed temporary file: `append` then `finish`, then `s[i]` or iterate."""

    def __init__(self, folder: str | os.PathLike | None = None, errors: str = "strict") -> None:
        self.errors = errors
        self.blob = DiskArray(np.uint8, folder)
        self.offsets = DiskArray(np.int64, folder)
        self._end = 0
        self.offsets.append(0)

    @classmethod
    def of(cls, texts: Iterable[str], folder: str | os.PathLike | None = None, errors: str = "strict") -> DiskStrings:
        """A finished table of `texts`."""
        table = cls(folder, errors)
        for text in texts:
            table.append(text)
        return table.finish()

    def append(self, text: str) -> None:
        """Add one string (encoded as UTF-8 with this table's `errors`)."""
        data = text.encode("utf-8", self.errors)
        self.blob.extend_bytes(data)
        self._end += len(data)
        self.offsets.append(self._end)

    def finish(self) -> DiskStrings:
        """Write what is pending; read-only from now on (returns itself)."""
        self.blob.finish()
        self.offsets.finish()
        return self

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> str:
        if not isinstance(index, (int, np.integer)):
            raise TypeError(f"indices must be integers, not {type(index).__name__}")
        length = len(self)
        position = int(index) + length if index < 0 else int(index)
        if not 0 <= position < length:
            raise IndexError(f"index {index} out of range for {length} strings")
        start, end = self.offsets[position:position + 2]
        return self.blob.read_bytes(int(start), int(end)).decode("utf-8", self.errors)

    def span(self, start: int, stop: int) -> list[str]:
        """Strings `start:stop` (two reads)."""
        stop = min(stop, len(self))
        if stop <= start:
            return []
        ends = self.offsets[start:stop + 1]
        base = int(ends[0])
        data = self.blob.read_bytes(base, int(ends[-1]))
        bounds = (ends - base).tolist()
        return [data[a:b].decode("utf-8", self.errors) for a, b in itertools.pairwise(bounds)]

    def __iter__(self) -> Iterator[str]:
        for start in range(0, len(self), STRING_BLOCK):  # one block's bytes in memory, each string made when reached
            stop = min(start + STRING_BLOCK, len(self))
            ends = self.offsets[start:stop + 1]
            base = int(ends[0])
            data = self.blob.read_bytes(base, int(ends[-1]))
            bounds = (ends - base).tolist()
            for a, b in itertools.pairwise(bounds):
                yield data[a:b].decode("utf-8", self.errors)

    def close(self) -> None:
        """Delete the files."""
        self.blob.close()
        self.offsets.close()


def id_hash(text: str) -> int:
    """A 64-bit hash of an id (blake2b; the same in every process, unlike `hash`)."""
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


class IdLookup:
    """Position of an id in a `DiskStrings` of ids: sorted 64-bit hashes and positions in memory (12 bytes per id),
    each hit checked against the stored string; a repeated id answers its last position (as a dict would)."""

    def __init__(self, ids: DiskStrings) -> None:
        self.ids = ids
        hashes = np.fromiter((id_hash(text) for text in ids), dtype=np.uint64, count=len(ids))
        order = np.argsort(hashes, kind="stable")
        self.hashes = hashes[order]
        self.order = order.astype(np.int32 if len(ids) < 2**31 else np.int64)

    def position(self, image_id: str) -> int | None:
        """The position of `image_id` (its last one when repeated), or None."""
        key = np.uint64(id_hash(image_id))
        low = int(np.searchsorted(self.hashes, key, side="left"))
        high = int(np.searchsorted(self.hashes, key, side="right"))
        for k in range(high - 1, low - 1, -1):  # equal ids keep their order (stable sort): the last first
            position = int(self.order[k])
            if self.ids[position] == image_id:
                return position
        return None

    def __contains__(self, image_id: object) -> bool:
        return isinstance(image_id, str) and self.position(image_id) is not None

    def __len__(self) -> int:
        return len(self.ids)

    def nbytes(self) -> int:
        """Bytes held in memory."""
        return self.hashes.nbytes + self.order.nbytes
