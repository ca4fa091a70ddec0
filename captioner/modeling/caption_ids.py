"""Tokenised training captions as two flat arrays on disk (token ids, int64 offsets; `pacs.metric.common.spill.DiskArray`)
instead of a tensor or a list per caption; a batch's `[B, max_length+1]` targets (ids, <eos>, <pad>) are read and
built on demand."""
from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from pacs.captioner.modeling.vocab import EOS_ID, PAD_ID
from pacs.metric.common.spill import DiskArray


class EncodedCaptions:
    """Token ids of many captions (no <eos>) in one array; caption `i` is `ids[offsets[i]:offsets[i+1]]`.

    `ids` and `offsets` are numpy arrays or `DiskArray`s (what `encode` makes: nothing per caption in memory).
    """

    def __init__(self, ids: np.ndarray | DiskArray, offsets: np.ndarray | DiskArray, max_length: int) -> None:
        self.ids = ids if isinstance(ids, DiskArray) else np.asarray(ids, dtype=np.int32)
        self.offsets = offsets if isinstance(offsets, DiskArray) else np.asarray(offsets, dtype=np.int64)
        self.max_length = int(max_length)
        if len(self.offsets) < 1 or int(self.offsets[0]) != 0 or int(self.offsets[-1]) != len(self.ids):
            raise ValueError("offsets must start at 0 and end at the number of ids")

    @classmethod
    def encode(cls, vocab: Any, captions: Iterable[str], block: int = 4096,
               folder: str | os.PathLike | None = None) -> EncodedCaptions:
        """Encode `captions` with `vocab.encode`, streamed to unnamed files in `folder` (`block` captions at a time;
        int16 ids when the vocabulary has fewer than 32,768 words, int32 otherwise)."""
        dtype = np.int16 if len(vocab) < 2**15 else np.int32
        ids_out, offsets_out = DiskArray(dtype, folder), DiskArray(np.int64, folder)
        offsets_out.append(0)
        pending: list[int] = []
        ends: list[int] = []
        total = 0

        def flush() -> None:
            ids_out.extend(pending)
            offsets_out.extend(ends)
            pending.clear()
            ends.clear()

        for caption in captions:
            ids = vocab.encode(caption)
            pending.extend(ids)
            total += len(ids)
            ends.append(total)
            if len(ends) >= block:
                flush()
        flush()
        return cls(ids_out.finish(), offsets_out.finish(), vocab.max_length)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def caption_ids(self, index: int) -> list[int]:
        """Token ids of caption `index` (no <eos>)."""
        start, end = self.offsets[index:index + 2]
        return self.ids[int(start):int(end)].tolist()

    def targets(self, rows: Sequence[int] | np.ndarray | torch.Tensor) -> torch.Tensor:
        """Targets `[len(rows), max_length+1]` (int64): each caption's ids, <eos>, then <pad>."""
        rows = np.asarray(rows.tolist() if isinstance(rows, torch.Tensor) else rows, dtype=np.int64).reshape(-1)
        width = self.max_length + 1
        out = np.full((len(rows), width), PAD_ID, dtype=np.int64)
        if len(rows) and (rows.min() < 0 or rows.max() >= len(self)):
            raise IndexError(f"caption index out of range for {len(self)} captions")
        for row, caption in enumerate(rows.tolist()):
            start, end = (int(x) for x in self.offsets[caption:caption + 2])  # two reads per caption
            if end - start > self.max_length:
                raise ValueError(f"a caption holds more than max_length={self.max_length} ids")
            out[row, :end - start] = self.ids[start:end]
            out[row, end - start] = EOS_ID
        return torch.from_numpy(out)

    def stored_bytes(self) -> int:
        """Bytes of the two arrays (on disk for `DiskArray`s)."""
        return sum(len(a) * np.dtype(a.dtype).itemsize for a in (self.ids, self.offsets))
