"""Numeric ids for words and n-grams, looked up in batches with NumPy (no per-n-gram Python objects).

An n-gram of order k is identified by the pair (id of its (k-1)-gram prefix, id of its last word), packed in
one int64 and kept in a sorted array, so a whole batch of sentences is resolved with `np.searchsorted`.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np

from metric.common.errors import InputError

WORD_BITS = 24
_MAX_WORDS = 1 << WORD_BITS


@dataclass
class Occurrences:
    """Every n-gram occurrence of a batch of sentences."""

    owner: np.ndarray  # sentence index
    position: np.ndarray  # index of the n-gram's first word in its sentence
    order: np.ndarray  # 0-based order (n-gram length - 1)
    gid: np.ndarray  # global id, -1 when unknown to the index (only when not growing)
    local: np.ndarray  # id unique to each distinct n-gram of this batch (known or not)
    num_local: int
    lengths: np.ndarray  # number of words of each sentence
    local_orders: np.ndarray  # 0-based order of each batch-local id


class NgramIndex:
    """A growing table of n-gram ids (1..n), shared across calls."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.words: dict[str, int] = {}
        self.size = 0
        self.orders = np.zeros(0, dtype=np.int64)
        self._keys = np.zeros(0, dtype=np.int64)
        self._gids = np.zeros(0, dtype=np.int64)

    def _resolve(self, packed: np.ndarray, order: int, grow: bool) -> np.ndarray:
        """Global ids of packed (prefix, word) keys; -1 for invalid keys or, without `grow`, unknown ones."""
        gid = np.full(len(packed), -1, dtype=np.int64)
        valid = np.flatnonzero(packed >= 0)
        if len(self._keys) and len(valid):
            where = np.minimum(np.searchsorted(self._keys, packed[valid]), len(self._keys) - 1)
            found = self._keys[where] == packed[valid]
            gid[valid[found]] = self._gids[where[found]]
        if grow:
            missing = valid[gid[valid] < 0]
            if len(missing):
                new_keys, inverse = np.unique(packed[missing], return_inverse=True)
                new_gids = self.size + np.arange(len(new_keys), dtype=np.int64)
                gid[missing] = new_gids[inverse]
                self.size += len(new_keys)
                self.orders = np.concatenate([self.orders, np.full(len(new_keys), order, dtype=np.int64)])
                keys = np.concatenate([self._keys, new_keys])
                gids = np.concatenate([self._gids, new_gids])
                sort = np.argsort(keys, kind="stable")
                self._keys, self._gids = keys[sort], gids[sort]
        return gid

    def occurrences(self, splits: Sequence[Sequence[str]], grow: bool) -> Occurrences:
        """All 1..n-gram occurrences of tokenized sentences with their global and batch-local ids."""
        lengths = np.fromiter(map(len, splits), dtype=np.int64, count=len(splits))
        flat = list(chain.from_iterable(splits))
        words = self.words
        if grow:
            for word in dict.fromkeys(flat):
                if word not in words:
                    words[word] = len(words)
            if len(words) >= _MAX_WORDS:
                raise InputError(f"more than {_MAX_WORDS - 1} distinct words: too many for the n-gram index")
        known_words = len(words)
        lookup = words.get
        word_ids = np.array([lookup(word, -1) for word in flat], dtype=np.int64)
        unknown_at = np.flatnonzero(word_ids < 0)
        if len(unknown_at):
            temporary: dict[str, int] = {}
            for at in unknown_at:
                word_ids[at] = known_words + temporary.setdefault(flat[at], len(temporary))
        width = known_words + (len(unknown_at) and int(word_ids.max()) - known_words + 1)
        total = len(flat)
        starts = np.cumsum(lengths) - lengths
        owner = np.repeat(np.arange(len(splits), dtype=np.int64), lengths)
        position = np.arange(total, dtype=np.int64) - np.repeat(starts, lengths)
        remaining = np.repeat(lengths, lengths) - position

        parts_owner, parts_position, parts_order, parts_gid, parts_local = [], [], [], [], []
        known_word = word_ids < known_words
        unique_words, local_prev = np.unique(word_ids, return_inverse=True)
        local_prev = local_prev.astype(np.int64)
        num_local = len(unique_words)
        local_orders = [np.zeros(num_local, dtype=np.int64)]
        gid_prev = self._resolve(np.where(known_word, word_ids, -1), 0, grow)
        parts_owner.append(owner)
        parts_position.append(position)
        parts_order.append(np.zeros(total, dtype=np.int64))
        parts_gid.append(gid_prev)
        parts_local.append(local_prev)
        for k in range(2, self.n + 1):
            at = np.flatnonzero(remaining >= k)
            last = word_ids[at + k - 1]
            prefix_local = local_prev[at]
            unique_keys, local = np.unique(prefix_local * width + last, return_inverse=True)
            local = local.astype(np.int64) + num_local
            num_local += len(unique_keys)
            local_orders.append(np.full(len(unique_keys), k - 1, dtype=np.int64))
            prefix_gid = gid_prev[at]
            packed = np.where((prefix_gid >= 0) & (last < known_words), ((prefix_gid + 1) << WORD_BITS) | last, -1)
            gid = self._resolve(packed, k - 1, grow)
            parts_owner.append(owner[at])
            parts_position.append(position[at])
            parts_order.append(np.full(len(at), k - 1, dtype=np.int64))
            parts_gid.append(gid)
            parts_local.append(local)
            # full-length arrays for the next level (only positions with room for a longer n-gram are read)
            local_prev = np.full(total, -1, dtype=np.int64)
            local_prev[at] = local
            gid_prev = np.full(total, -1, dtype=np.int64)
            gid_prev[at] = gid
        return Occurrences(np.concatenate(parts_owner), np.concatenate(parts_position),
                           np.concatenate(parts_order), np.concatenate(parts_gid), np.concatenate(parts_local),
                           num_local, lengths, np.concatenate(local_orders))
