"""Compact n-gram machinery for CIDEr-D: word ids, packed n-gram keys, per-chunk n-gram statistics.

No Python object per n-gram. A word is one entry of a dict (`Vocabulary`); a tokenised corpus is two arrays
(`TokenArrays`: the word id of every token, the length of every sentence); an n-gram of up to `n` words is one
int64 key: its word ids plus one, packed in `word_bits(n)` bits each (16 for n <= 4), then multiplied by an odd
constant. That multiplication is a bijection of the 64-bit integers, so equal keys mean equal n-grams (no
hashing collision is possible), and it spreads the top bits evenly: `KeyTable` indexes a directory with them
and `aggregate` splits the work into partitions by them.

`ngram_levels` computes the n-gram statistics of a chunk of sentences, one order at a time, with one sort of
int64 values per order: within a chunk an n-gram of order k is identified by (id of its (k-1)-gram prefix,
last word), packed together with the occurrence index, so sorting the packed values groups equal n-grams and,
inside a group, orders the occurrences by sentence. Work is done in chunks of bounded size so that every
array stays in the CPU caches and the time per n-gram does not grow with the corpus.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat

import numpy as np

from pacs.metric.common.errors import InputError

#: sentences joined into one string per `str.split` call when encoding (bounds the temporary token list)
_ENCODE_BLOCK = 2048
_MIX = np.uint64(0x9E3779B97F4A7C15)  # odd: multiplying by it is a bijection modulo 2**64
_UNMIX = np.uint64(pow(0x9E3779B97F4A7C15, -1, 1 << 64))


def word_bits(n: int) -> int:
    """Bits per word in a packed key of an n-gram of up to `n` words (16 for n <= 4)."""
    return min(16, 64 // max(1, n))


def max_words(n: int) -> int:
    """The most distinct words a `Vocabulary` may hold for keys of n-grams of up to `n` words."""
    return (1 << word_bits(n)) - 1


def mix(packed: np.ndarray) -> np.ndarray:
    """Mixed int64 keys of packed (uint64) word-id digits: a bijection, so no two n-grams share a key."""
    return (packed.astype(np.uint64, copy=False) * _MIX).view(np.int64)


def unmix(keys: np.ndarray) -> np.ndarray:
    """The packed uint64 word-id digits of mixed keys (inverse of `mix`)."""
    return np.ascontiguousarray(keys, dtype=np.int64).view(np.uint64) * _UNMIX


def decode_keys(keys: np.ndarray, n: int) -> list[np.ndarray]:
    """Word ids of mixed keys: one int64 array per position (first word first), -1 past an n-gram's end."""
    bits = word_bits(n)
    packed = unmix(keys)
    digits = [((packed >> np.uint64(bits * shift)) & np.uint64((1 << bits) - 1)).astype(np.int64)
              for shift in range(n - 1, -1, -1)]
    size = np.zeros(len(keys), dtype=np.int64)
    for digit in digits:
        size += digit > 0
    columns = []
    for position in range(n):  # the digits of a k-gram are the last k of the n
        column = np.full(len(keys), -1, dtype=np.int64)
        for k in range(position + 1, n + 1):
            rows = size == k
            column[rows] = digits[n - k + position][rows] - 1
        columns.append(column)
    return columns


def encode_words(word_ids: Sequence[Sequence[int]], n: int) -> np.ndarray:
    """Mixed keys of n-grams given as sequences of word ids (each of 1..n ids, all below `max_words(n)`)."""
    bits = np.uint64(word_bits(n))
    packed = np.zeros(len(word_ids), dtype=np.uint64)
    for row, ids in enumerate(word_ids):
        value = 0
        for word in ids:
            value = (value << int(bits)) | (int(word) + 1)
        packed[row] = value
    return mix(packed)


class VocabularyFull(InputError):
    """More distinct words than the packed n-gram keys can hold."""


@dataclass
class TokenArrays:
    """Tokenised sentences: the word id of every token (sentence after sentence) and each sentence's length."""

    ids: np.ndarray  # int32
    lengths: np.ndarray  # int64

    @property
    def offsets(self) -> np.ndarray:
        """Index of each sentence's first token, plus the total at the end."""
        return np.concatenate([[0], np.cumsum(self.lengths)])

    def span(self, first: int, last: int, offsets: np.ndarray) -> TokenArrays:
        """Sentences first..last-1 (views, no copy); `offsets` is `self.offsets`."""
        return TokenArrays(self.ids[offsets[first]:offsets[last]], self.lengths[first:last])

    def take(self, sentences: np.ndarray, offsets: np.ndarray) -> TokenArrays:
        """The given sentences, in that order (copies); `offsets` is `self.offsets`."""
        lengths = self.lengths[sentences]
        ends = np.cumsum(lengths)
        total = int(ends[-1]) if len(ends) else 0
        positions = np.repeat(offsets[sentences] - (ends - lengths), lengths) + np.arange(total, dtype=np.int64)
        return TokenArrays(self.ids[positions], lengths)


class Vocabulary:
    """Word ids (insertion order) of a growing vocabulary, with a capacity fixed by the key width."""

    def __init__(self, words: Iterable[str] = (), capacity: int = max_words(4)) -> None:
        self.ids: dict[str, int] = {}
        self.capacity = capacity
        for word in words:
            self.ids.setdefault(word, len(self.ids))
        self._check()

    def __len__(self) -> int:
        return len(self.ids)

    def words(self) -> list[str]:
        """Every word, in id order."""
        return list(self.ids)

    def _check(self) -> None:
        if len(self.ids) > self.capacity:
            raise VocabularyFull(f"more than {self.capacity:,} distinct words: too many for CIDEr-D's packed n-gram "
                             f"keys (at most {self.capacity:,} distinct reference words per scorer)")

    def encode(self, sentences: Sequence[str], grow: bool) -> TokenArrays:
        """Word ids of whitespace-split sentences; `grow` adds new words, otherwise they get ids >= len(self)
        (temporary, consistent within this call only)."""
        sentences = sentences if isinstance(sentences, list) else list(sentences)
        lengths = np.fromiter(map(len, map(str.split, sentences)), dtype=np.int64, count=len(sentences))
        ids = np.empty(int(lengths.sum()), dtype=np.int32)
        lookup, table = self.ids.get, self.ids
        temporary: dict[str, int] = {}
        base = len(table)
        at = 0
        for start in range(0, len(sentences), _ENCODE_BLOCK):
            tokens = " ".join(sentences[start:start + _ENCODE_BLOCK]).split()
            block = np.fromiter(map(lookup, tokens, repeat(-1)), dtype=np.int32, count=len(tokens))
            for where in np.flatnonzero(block < 0).tolist():
                word = tokens[where]
                if grow:
                    block[where] = table.setdefault(word, len(table))
                else:
                    block[where] = base + temporary.setdefault(word, len(temporary))
            ids[at:at + len(block)] = block
            at += len(block)
        if grow:
            self._check()
        return TokenArrays(ids, lengths)


def sort_with_index(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`values` sorted (non-negative int64) and the stable permutation that sorts them.

    Packs the index into the low bits and sorts plain int64 values (much faster than `argsort`) when the
    bits fit; a stable argsort otherwise.
    """
    count = len(values)
    index_bits = max(1, (count - 1).bit_length())
    top = int(values.max()) if count else 0
    if top < 1 << (63 - index_bits):
        packed = np.sort((values << index_bits) | np.arange(count, dtype=np.int64))
        return packed >> index_bits, packed & ((1 << index_bits) - 1)
    order = np.argsort(values, kind="stable")
    return values[order], order


def run_starts(*sorted_columns: np.ndarray) -> np.ndarray:
    """Boolean array: True where any column differs from the previous row (and at row 0)."""
    count = len(sorted_columns[0])
    new = np.zeros(count, dtype=bool)
    if count:
        new[0] = True
        for column in sorted_columns:
            new[1:] |= column[1:] != column[:-1]
    return new


@dataclass
class Level:
    """Statistics of the n-grams of one order in a chunk of sentences.

    Entries are the distinct (n-gram, sentence) pairs, sorted by n-gram (local id) then sentence.
    """

    ids: np.ndarray  # int32 local id (0..len(keys)-1) of each entry's n-gram
    sentences: np.ndarray  # int32 chunk-local sentence of each entry
    counts: np.ndarray  # int32 occurrences of the n-gram in the sentence
    keys: np.ndarray  # mixed key of each local id
    known: np.ndarray  # False for an n-gram with a temporary (out-of-vocabulary) word


def ngram_levels(tokens: TokenArrays, n: int, known_words: int) -> list[Level]:
    """The 1..n-gram statistics of a chunk of sentences (word ids >= `known_words` are temporary)."""
    words = tokens.ids.astype(np.int64)
    lengths = tokens.lengths
    total = len(words)
    bits = np.uint64(word_bits(n))
    owner = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    starts = np.cumsum(lengths) - lengths
    room = np.repeat(lengths, lengths) - (np.arange(total, dtype=np.int64) - np.repeat(starts, lengths))
    width = int(words.max()) + 1 if total else 1
    at = np.arange(total, dtype=np.int64)
    local = words
    packed_prev = known_prev = None
    levels: list[Level] = []
    for k in range(1, n + 1):
        if k > 1:
            keep = room[at] >= k
            at = at[keep]
            local = local[keep] * width + words[at + (k - 1)]
        if len(at) == 0:
            empty = np.zeros(0, dtype=np.int32)
            levels.append(Level(empty, empty, empty, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)))
            continue
        sorted_keys, order = sort_with_index(local)
        new = run_starts(sorted_keys)
        dense = np.cumsum(new) - 1
        local = np.empty(len(at), dtype=np.int64)
        local[order] = dense
        sentence = owner[at[order]]
        entry = np.flatnonzero(new | run_starts(sentence))
        counts = np.diff(np.append(entry, len(at)))
        distinct = sorted_keys[new]
        if k == 1:
            last = distinct
            packed = (last + 1).astype(np.uint64)
            known = last < known_words
        else:
            parent, last = np.divmod(distinct, width)
            packed = (packed_prev[parent] << bits) | (last + 1).astype(np.uint64)
            known = known_prev[parent] & (last < known_words)
        levels.append(Level(dense[entry].astype(np.int32), sentence[entry].astype(np.int32),
                            counts.astype(np.int32), mix(packed), known))
        packed_prev, known_prev = packed, known
    return levels


class KeyTable:
    """Sorted mixed keys with a directory on their top bits: vectorised lookups in O(1) per key.

    >>> import numpy as np
    >>> table = KeyTable(np.sort(encode_words([[0], [1], [0, 1]], 4)))
    >>> int((table.find(encode_words([[0, 1], [1, 0]], 4)) >= 0).sum())
    1
    """

    def __init__(self, keys: np.ndarray) -> None:
        self.keys = np.ascontiguousarray(keys, dtype=np.int64)
        self.bits = max(1, len(self.keys).bit_length() - 1)  # one to two keys per directory slot
        slot = (self.keys >> (64 - self.bits)) + (1 << (self.bits - 1))
        counts = np.bincount(slot, minlength=1 << self.bits)
        dtype = np.int32 if len(self.keys) < 2 ** 31 else np.int64
        self.directory = np.concatenate([[0], np.cumsum(counts)]).astype(dtype)

    def __len__(self) -> int:
        return len(self.keys)

    def find(self, queries: np.ndarray) -> np.ndarray:
        """Row of each query key in `keys`, -1 when absent."""
        count = len(self.keys)
        if count == 0 or len(queries) == 0:
            return np.full(len(queries), -1, dtype=np.int64)
        slot = (queries >> (64 - self.bits)) + (1 << (self.bits - 1))
        low = self.directory[slot].astype(np.int64)
        high = self.directory[slot + 1].astype(np.int64)
        active = np.flatnonzero(low < high)
        while len(active):  # binary search inside each query's (short) directory slot
            middle = (low[active] + high[active]) >> 1
            right = self.keys[middle] < queries[active]
            low[active[right]] = middle[right] + 1
            high[active[~right]] = middle[~right]
            active = active[low[active] < high[active]]
        found = low < count
        found[found] = self.keys[low[found]] == queries[found]
        return np.where(found, low, -1)


#: keys per partition of `aggregate` (bounded, so that each partition's sort stays in the caches)
PARTITION_SIZE = 1 << 17


def aggregate(chunks: Sequence[tuple[np.ndarray, np.ndarray]], minimum: float = 1.0, per_chunk: bool = True,
              dtype: type = np.float64) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """Sum counts of equal keys over chunks of (sorted unique keys, counts).

    Returns the total of each chunk key (in its chunk's order; empty unless `per_chunk`) and the table of
    every key whose total is at least `minimum` (sorted keys, totals as `dtype`). Keys are split into partitions
    by their top bits (a range of each sorted chunk), and each partition is summed on its own, so the work per
    key does not grow with the number of keys.
    """
    total = sum(len(keys) for keys, _ in chunks)
    partition_bits = min(16, max(0, (max(total, 1) - 1) // PARTITION_SIZE).bit_length())
    if partition_bits:
        half, shift = 1 << (partition_bits - 1), 64 - partition_bits
        bounds_values = np.array([(j - half) << shift for j in range(1, 1 << partition_bits)], dtype=np.int64)
        bounds = [[0, *np.searchsorted(keys, bounds_values).tolist(), len(keys)] for keys, _ in chunks]
    else:
        bounds = [[0, len(keys)] for keys, _ in chunks]
    pieces: list[list[np.ndarray]] = [[] for _ in chunks]
    table_keys, table_totals = [], []
    for part in range(1 << partition_bits):
        spans = [(index, bound[part], bound[part + 1]) for index, bound in enumerate(bounds)
                 if bound[part + 1] > bound[part]]
        if not spans:
            continue
        unique, inverse = np.unique(np.concatenate([chunks[index][0][lo:hi] for index, lo, hi in spans]),
                                    return_inverse=True)
        inverse = inverse.reshape(-1)
        counts = np.concatenate([chunks[index][1][lo:hi] for index, lo, hi in spans])
        totals = np.bincount(inverse, weights=counts, minlength=len(unique))
        if per_chunk:
            per_key = totals[inverse]
            at = 0
            for index, lo, hi in spans:
                pieces[index].append(per_key[at:at + hi - lo])
                at += hi - lo
        keep = totals >= minimum
        table_keys.append(unique[keep])
        table_totals.append(totals[keep].astype(dtype))
    per_chunk_totals = [np.concatenate(piece) if piece else np.zeros(0) for piece in pieces] if per_chunk else []
    if table_keys:
        return per_chunk_totals, np.concatenate(table_keys), np.concatenate(table_totals)
    return per_chunk_totals, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=dtype)
