"""Hostile image files for any test: `from image_files import decompression_bomb` (tests/ is on the path)."""
from __future__ import annotations

import struct
import zlib
from pathlib import Path


def decompression_bomb(path: Path, side: int = 30000) -> Path:
    """A PNG whose header says side × side pixels (1-bit grey) with one row of data: PIL refuses it at open as a
    decompression bomb."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(bytes(side // 8 + 1)))
                     + chunk(b"IEND", b""))
    return path
