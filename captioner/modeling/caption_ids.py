"""Tokenised training captions as two flat arrays (int32 token ids, int64 offsets) instead of a tensor or a list per
caption; a batch's `[B, max_length+1]` targets (ids, <eos>, <pad>) are built from them on demand."""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from captioner.modeling.vocab import EOS_ID, PAD_ID


class EncodedCaptions:
    """Token ids of many captions (no <eos>) in one int32 array; caption `i` is `ids[offsets[i]:offsets[i+1]]`."""

    def __init__(self, ids: np.ndarray, offsets: np.ndarray, max_length: int) -> None:
        self.ids = np.asarray(ids, dtype=np.int32)
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.max_length = int(max_length)
        if self.offsets.ndim != 1 or len(self.offsets) < 1 or self.offsets[0] != 0 \
                or self.offsets[-1] != len(self.ids):
            raise ValueError("offsets must start at 0 and end at the number of ids")

    @classmethod
    def encode(cls, vocab: Any, captions: Iterable[str], block: int = 65536) -> EncodedCaptions:
        """Encode `captions` with `vocab.encode` (streamed: Python lists only for `block` captions at a time)."""
        id_blocks: list[np.ndarray] = []
        length_blocks: list[np.ndarray] = []
        pending: list[int] = []
        lengths: list[int] = []

        def flush() -> None:
            id_blocks.append(np.asarray(pending, dtype=np.int32))
            length_blocks.append(np.asarray(lengths, dtype=np.int64))
            pending.clear()
            lengths.clear()

        for caption in captions:
            ids = vocab.encode(caption)
            pending.extend(ids)
            lengths.append(len(ids))
            if len(lengths) >= block:
                flush()
        flush()
        all_lengths = np.concatenate(length_blocks)
        offsets = np.zeros(len(all_lengths) + 1, dtype=np.int64)
        np.cumsum(all_lengths, out=offsets[1:])
        return cls(np.concatenate(id_blocks), offsets, vocab.max_length)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def caption_ids(self, index: int) -> list[int]:
        """Token ids of caption `index` (no <eos>)."""
        return self.ids[self.offsets[index]:self.offsets[index + 1]].tolist()

    def targets(self, rows: Sequence[int] | np.ndarray | torch.Tensor) -> torch.Tensor:
        """Targets `[len(rows), max_length+1]` (int64): each caption's ids, <eos>, then <pad>."""
        rows = np.asarray(rows.tolist() if isinstance(rows, torch.Tensor) else rows, dtype=np.int64).reshape(-1)
        width = self.max_length + 1
        out = np.full((len(rows), width), PAD_ID, dtype=np.int64)
        starts, ends = self.offsets[rows], self.offsets[rows + 1]
        lengths = ends - starts
        if (lengths > self.max_length).any():
            raise ValueError(f"a caption holds more than max_length={self.max_length} ids")
        # token j of row r sits at column j: gather with one mask over the [B, width] grid
        columns = np.arange(width)
        inside = columns[None, :] < lengths[:, None]
        out[inside] = self.ids[(starts[:, None] + columns[None, :])[inside]]
        out[np.arange(len(rows)), lengths] = EOS_ID
        return torch.from_numpy(out)

    def nbytes(self) -> int:
        """Bytes held by the two arrays."""
        return self.ids.nbytes + self.offsets.nbytes
