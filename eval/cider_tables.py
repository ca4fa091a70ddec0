"""CIDEr-D document frequencies as compact arrays: `DocumentFrequency` and `cider_df`.

A table is its vocabulary (one string per word), the sorted int64 keys of its n-grams (`pacs.eval.ngram_index`) and
one document frequency per key: no Python object per n-gram. It is built in chunks of about `CHUNK_TOKENS`
tokens, document frequencies counted per chunk by sorting and run-length counting, then summed over chunks
by partitions of the key space (`pacs.eval.ngram_index.aggregate`), so time and memory grow linearly with the corpus.
"""
from __future__ import annotations

import base64
import gzip
import hashlib
import itertools
import json
import logging
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

from pacs.eval.ngram_index import (
    KeyTable,
    Level,
    TokenArrays,
    Vocabulary,
    decode_keys,
    encode_words,
    max_words,
    ngram_levels,
    run_starts,
)
from pacs.eval.tokenize import check_ptb_tokenizer, ptb_tokenize
from pacs.metric.common.errors import InputError
from pacs.metric.common.io import atomic_path
from pacs.metric.common.spill import DiskArray

log = logging.getLogger(__name__)

NGRAM_ORDER = 4
#: tokens per chunk of sentences: every array of a chunk stays in the CPU caches
CHUNK_TOKENS = 1 << 15
CORPUS_BLOCK = 4096  # reference sets encoded at a time by `cider_df`
MERGE_KEYS = 1 << 18  # chunk keys gathered (16 bytes each) before they are summed into the running table
PARTITION_BITS = 8  # the running table's parts (by the keys' top bits)
_FORMAT_V1 = "pacs-cider-df/1"  # JSON n-gram -> count (read only)
_FORMAT = "pacs-cider-df/2"  # JSON with the vocabulary and base64 little-endian arrays


def check_reference_sets(references: Sequence[Sequence[str]], what: str, first: int = 0) -> None:
    """Raise InputError when a reference set is a bare string or empty (named `what[first + index]`)."""
    for index, refs in enumerate(references, start=first):
        if isinstance(refs, str):
            raise InputError(f"{what}[{index}] is a string; expected a list of reference sentences")
        if len(refs) == 0:
            raise InputError(f"{what}[{index}] has no references")


def corpus_sha256(reference_corpus: Sequence[Sequence[str]]) -> str:
    """Hash a corpus of reference sets (order and content) to validate a disk cache."""
    digest = hashlib.sha256()
    _hash_sets(digest, reference_corpus)
    return digest.hexdigest()


def chunk_bounds(set_tokens: np.ndarray, target: int | None = None) -> np.ndarray:
    """First set of each chunk of consecutive sets holding about `target` (`CHUNK_TOKENS`) tokens, plus the end."""
    target = CHUNK_TOKENS if target is None else target
    if len(set_tokens) == 0:
        return np.zeros(1, dtype=np.int64)
    chunk = (np.cumsum(set_tokens) - set_tokens) // max(1, target)
    return np.concatenate([[0], np.flatnonzero(chunk[1:] != chunk[:-1]) + 1, [len(set_tokens)]])


def document_counts(levels: list[Level], document: np.ndarray,
                    weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Keys of every n-gram of a chunk and the (weighted) number of documents holding it.

    `document[s]` is the document of chunk sentence s, non-decreasing in s.
    """
    keys, counts = [], []
    for level in levels:
        owner = document[level.sentences]
        first = run_starts(level.ids, owner)  # entries are sorted by n-gram, then sentence (so document)
        counted = np.bincount(level.ids[first], weights=None if weights is None else weights[owner[first]],
                              minlength=len(level.keys))
        keys.append(level.keys)
        counts.append(counted.astype(np.int32) if weights is None else counted)
    return np.concatenate(keys), np.concatenate(counts)


def _b64(array: np.ndarray, dtype: str) -> str:
    return base64.b64encode(np.ascontiguousarray(array, dtype=dtype).tobytes()).decode("ascii")


class CountsView(Mapping):
    """Read-only mapping n-gram -> document frequency, decoded from a table's arrays on access.

    Keys are a word (str) for unigrams and a tuple of words otherwise, as in pycocoevalcap.
    """

    def __init__(self, table: DocumentFrequency) -> None:
        self._table = table

    def __getitem__(self, gram: str | tuple) -> float:
        row = self._table.row(gram)
        if row < 0:
            raise KeyError(gram)
        return float(self._table.df[row])

    def __iter__(self) -> Iterator[str | tuple]:
        words = self._table.words
        for start in range(0, len(self._table.keys), 1 << 16):
            columns = [column.tolist() for column in decode_keys(self._table.keys[start:start + (1 << 16)],
                                                                 self._table.n)]
            for ids in zip(*columns):
                gram = tuple(words[i] for i in ids if i >= 0)
                yield gram[0] if len(gram) == 1 else gram

    def __len__(self) -> int:
        return len(self._table.keys)


class DocumentFrequency:
    """Document frequencies of n-grams over a corpus of reference sets, plus the number of documents.

    Built by `cider_df` as compact arrays (`words`, sorted int64 `keys`, `df`); `counts` reads them as a
    mapping n-gram -> frequency. `save` / `load` keep it on disk (JSON, gzipped with a `.gz` suffix):

    >>> import os, tempfile
    >>> from pacs.eval import DocumentFrequency, cider_df
    >>> table = cider_df([["a dog running on grass", "the dog is in a field"], ["a man on a horse"]])
    >>> table.num_documents, table.counts["dog"], table.counts[("a", "man")]
    (2.0, 1.0, 1.0)
    >>> path = os.path.join(tempfile.mkdtemp(), "df.json.gz")
    >>> table.save(path)
    >>> DocumentFrequency.load(path) == table
    True
    """

    def __init__(self, counts: Mapping, num_documents: float, n: int = NGRAM_ORDER, corpus_sha256: str = "") -> None:
        words: dict[str, int] = {}
        grams = [[gram] if isinstance(gram, str) else list(gram) for gram in counts]
        ids = [[words.setdefault(word, len(words)) for word in gram] for gram in grams]
        if len(words) > max_words(n):
            raise InputError(f"more than {max_words(n):,} distinct words: too many for CIDEr-D's n-gram keys")
        keys = encode_words(ids, n)
        df = np.fromiter((float(value) for value in counts.values()), dtype=np.float64, count=len(grams))
        order = np.argsort(keys, kind="stable")
        self._set(list(words), keys[order], df[order], num_documents, n, corpus_sha256)

    def _set(self, words: list[str], keys: np.ndarray, df: np.ndarray, num_documents: float, n: int,
             sha: str) -> None:
        self.words = words
        self.keys = keys
        df = np.asarray(df)
        if np.array_equal(df, np.round(df)):  # counts of documents (a hand-made table may hold other values)
            df = df.astype(np.int32 if num_documents < 2 ** 31 else np.int64)
        self.df = df
        self.num_documents = float(num_documents)
        self.n = n
        self.corpus_sha256 = sha
        #: objects its users keep with this table (`cider_d` keeps its scorer), dropped with it
        self.kept: dict[str, object] = {}
        self._table: KeyTable | None = None
        self._frequent: tuple[KeyTable, np.ndarray] | None = None
        self._word_ids: dict[str, int] | None = None

    @classmethod
    def from_arrays(cls, words: list[str], keys: np.ndarray, df: np.ndarray, num_documents: float,
                    n: int = NGRAM_ORDER, corpus_sha256: str = "") -> DocumentFrequency:
        """A table from its arrays (keys sorted, as `cider_df` makes them)."""
        table = cls.__new__(cls)
        table._set(words, keys, df, num_documents, n, corpus_sha256)
        return table

    @property
    def counts(self) -> CountsView:
        """The table as a mapping n-gram (str for unigrams, tuple of words otherwise) -> document frequency."""
        return CountsView(self)

    @property
    def log_num_documents(self) -> float:
        """The `ref_len` of pycocoevalcap: log of the number of documents."""
        return float(np.log(float(self.num_documents)))

    @property
    def table(self) -> KeyTable:
        """The lookup structure over `keys` (built once, shared by every scorer on this table)."""
        if self._table is None:
            self._table = KeyTable(self.keys)
        return self._table

    @property
    def word_ids(self) -> dict[str, int]:
        """Word -> id of this table's vocabulary."""
        if self._word_ids is None:
            self._word_ids = {word: index for index, word in enumerate(self.words)}
        return self._word_ids

    @property
    def nbytes(self) -> int:
        """Bytes held by the arrays (keys, frequencies and, once built, the lookup structures)."""
        extra = 0 if self._table is None else self._table.directory.nbytes
        if self._frequent is not None:
            table, values = self._frequent
            extra += table.keys.nbytes + table.directory.nbytes + values.nbytes
        return int(self.keys.nbytes + self.df.nbytes + extra)

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Document frequency (float) of each key, 0 for keys absent from the table."""
        rows = self.table.find(keys)
        found = rows >= 0
        out = np.zeros(len(keys))
        out[found] = self.df[rows[found]]
        return out

    def frequent_df(self, keys: np.ndarray) -> np.ndarray:
        """Document frequency (float) of keys held by two or more documents, 0 for the others.

        df 0 and df 1 give the same idf (log(max(1, df)) = 0), so scorers look up only the n-grams that repeat
        across documents: a table several times smaller than `keys`, built once and shared.
        """
        if self._frequent is None:
            repeated = self.df >= 2
            self._frequent = (KeyTable(self.keys[repeated]), self.df[repeated])
        table, values = self._frequent
        rows = table.find(keys)
        out = np.zeros(len(keys))
        out[rows >= 0] = values[rows[rows >= 0]]
        return out

    def row(self, gram: str | tuple) -> int:
        """Row of an n-gram in the arrays, -1 when absent."""
        if not isinstance(gram, (str, tuple)):
            return -1
        words = [gram] if isinstance(gram, str) else list(gram)
        ids = [self.word_ids.get(word, -1) if isinstance(word, str) else -1 for word in words]
        if not 1 <= len(ids) <= self.n or min(ids) < 0:
            return -1
        return int(self.table.find(encode_words([ids], self.n))[0])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DocumentFrequency):
            return NotImplemented
        if (self.n, self.num_documents, self.corpus_sha256) != (other.n, other.num_documents, other.corpus_sha256):
            return False
        if self.words == other.words:
            return bool(np.array_equal(self.keys, other.keys) and np.array_equal(self.df, other.df))
        return len(self.keys) == len(other.keys) and dict(self.counts.items()) == dict(other.counts.items())

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"DocumentFrequency({len(self.keys):,} n-grams, {len(self.words):,} words, "
                f"num_documents={self.num_documents:g}, n={self.n})")

    def save(self, path: str | os.PathLike) -> None:
        """Write the table atomically as (optionally gzipped, by `.gz` suffix) JSON."""
        payload = {"format": _FORMAT, "n": self.n, "num_documents": self.num_documents,
                   "corpus_sha256": self.corpus_sha256, "words": self.words,
                   "keys": _b64(self.keys, "<i8"), "df": _b64(self.df, "<i8" if self.df.dtype.kind == "i" else "<f8"),
                   "df_dtype": "<i8" if self.df.dtype.kind == "i" else "<f8"}
        data = json.dumps(payload, ensure_ascii=False, allow_nan=False).encode("utf-8")
        with atomic_path(path) as tmp:
            if str(path).endswith(".gz"):
                with gzip.open(tmp, "wb", compresslevel=6) as handle:
                    handle.write(data)
            else:
                Path(tmp).write_bytes(data)

    @classmethod
    def load(cls, path: str | os.PathLike) -> DocumentFrequency:
        """Read a table written by `save` (or by pacs 0.3/0.4); a malformed file raises InputError naming it."""
        path = Path(path)
        try:
            if path.suffix == ".gz":
                with gzip.open(path, "rb") as handle:
                    raw = handle.read()
            else:
                raw = path.read_bytes()
            payload = json.loads(raw.decode("utf-8"))
        except (OSError, ValueError) as error:
            raise InputError(f"{path}: not a readable CIDEr document-frequency file ({error})") from None
        if not isinstance(payload, dict) or payload.get("format") not in (_FORMAT, _FORMAT_V1):
            raise InputError(f"{path}: not a pacs CIDEr document-frequency file (format {_FORMAT!r} expected)")
        n, sha, documents = int(payload["n"]), payload.get("corpus_sha256", ""), float(payload["num_documents"])
        if payload["format"] == _FORMAT_V1:
            counts = {(key if " " not in key else tuple(key.split(" "))): float(value)
                      for key, value in payload["counts"].items()}
            return cls(counts, documents, n, sha)
        try:
            keys = np.frombuffer(base64.b64decode(payload["keys"]), dtype="<i8").astype(np.int64)
            df = np.frombuffer(base64.b64decode(payload["df"]), dtype=payload.get("df_dtype", "<i8"))
        except (KeyError, ValueError, TypeError) as error:
            raise InputError(f"{path}: damaged CIDEr document-frequency arrays ({error})") from None
        if len(keys) != len(df) or np.any(keys[1:] <= keys[:-1]) or len(payload["words"]) > max_words(n):
            raise InputError(f"{path}: damaged CIDEr document-frequency arrays")
        return cls.from_arrays(list(payload["words"]), keys, df, documents, n, sha)


def cider_df(reference_corpus: Sequence[Sequence[str]], n: int = NGRAM_ORDER,
             cache_path: str | os.PathLike | None = None, tokenized: bool = False,
             tokenizer: str = "python") -> DocumentFrequency:
    """Document frequencies over `reference_corpus` (one document = one image's list of references).

    With `cache_path`, a table previously saved for the same corpus (sha256 match) is loaded instead of
    recomputed, and a freshly computed table is saved there. References are PTB-tokenized first, as `cider_d`
    tokenizes them (`tokenizer`: "python" or "java"); `tokenized=True` takes space-joined tokens as given.

    >>> from pacs.eval import cider_d, cider_df
    >>> train = [["a dog running on grass", "the dog is in a field"], ["a man on a horse", "a rider and his horse"],
    ...          ["two cats sleep on a sofa"]]
    >>> df = cider_df(train)  # cider_df(train, cache_path="df.json.gz") also caches it on disk
    >>> df.num_documents
    3.0
    >>> cider_d(["a man rides a horse"], [["a man on a horse", "a rider and his horse"]],
    ...         document_frequency=df).round(4).tolist()  # fixed frequencies (the SCST reward's)
    [2.0873]
    """
    check_ptb_tokenizer(tokenizer)
    starts = range(0, len(reference_corpus), CORPUS_BLOCK)
    blocks = (reference_corpus[start:start + CORPUS_BLOCK] for start in starts)
    if not tokenized:
        blocks = (_tokenized_block(reference_corpus[start:start + CORPUS_BLOCK], start, tokenizer) for start in starts)
    return cider_df_blocks(blocks, n, cache_path)


def _tokenized_block(block: Sequence[Sequence[str]], first: int, tokenizer: str) -> list[list[str]]:
    """The reference sets of `block` (corpus index `first` on) PTB-tokenized in one tokenizer call."""
    check_reference_sets(block, "reference_corpus", first)
    flat = ptb_tokenize([ref for refs in block for ref in refs], tokenizer)
    out, start = [], 0
    for refs in block:
        out.append(flat[start:start + len(refs)])
        start += len(refs)
    return out


def cider_df_blocks(blocks: Iterable[Sequence[Sequence[str]]], n: int = NGRAM_ORDER,
                    cache_path: str | os.PathLike | None = None, what: str = "reference_corpus") -> DocumentFrequency:
    """`cider_df` of the concatenation of `blocks` (each a list of tokenized reference sets), read one at a time.

    Each block is hashed and encoded into word ids (`TokenArrays`: an int32 per token, a length per sentence)
    before the next one is read, so the caller can tokenize a large corpus block by block and never hold its
    strings; the table, its vocabulary order and its `corpus_sha256` equal `cider_df` of the whole corpus.
    A bad reference set is reported by its index in the whole corpus (`what[index]`).
    """
    digest = hashlib.sha256()
    vocabulary = Vocabulary(capacity=max_words(n))
    spilled = _SpilledBlocks()  # the encoded blocks on disk: memory holds one block, not the corpus
    seen = 0
    for block in blocks:
        block = block if isinstance(block, list) else list(block)
        check_reference_sets(block, what, seen)
        _hash_sets(digest, block)
        tokens = vocabulary.encode([ref for refs in block for ref in refs], grow=True)
        spilled.add(tokens, np.fromiter(map(len, block), dtype=np.int64, count=len(block)))
        seen += len(block)
        del block, tokens
    sha = digest.hexdigest()
    if cache_path is not None and Path(cache_path).is_file():
        cached = DocumentFrequency.load(cache_path)
        if cached.corpus_sha256 == sha and cached.n == n:
            log.info("CIDEr document frequencies loaded from %s", cache_path)
            return cached
        log.info("CIDEr document-frequency cache %s is for another corpus; recomputing", cache_path)
    table = _df_table(spilled, vocabulary, n, sha)
    if cache_path is not None:
        table.save(cache_path)
    return table


class _SpilledBlocks:
    """Encoded blocks of reference sets in unnamed files (word ids, sentence lengths, sentences per set), read
    back block by block."""

    def __init__(self) -> None:
        self.ids, self.lengths, self.sizes = DiskArray(np.int32), DiskArray(np.int64), DiskArray(np.int64)
        self.extents: list[tuple[int, int, int, int, int, int]] = []  # per block: token, sentence, set ranges

    def add(self, tokens: TokenArrays, sizes: np.ndarray) -> None:
        """Append one block's encoded sentences and its sets' sizes."""
        self.extents.append((len(self.ids), len(self.ids) + len(tokens.ids), len(self.lengths),
                             len(self.lengths) + len(tokens.lengths), len(self.sizes), len(self.sizes) + len(sizes)))
        self.ids.extend(tokens.ids)
        self.lengths.extend(tokens.lengths)
        self.sizes.extend(sizes)

    @property
    def num_sets(self) -> int:
        """Reference sets (documents) over every block."""
        return len(self.sizes)

    def blocks(self) -> Iterator[tuple[TokenArrays, np.ndarray]]:
        """Each block's sentences and set sizes, read back in order."""
        for array in (self.ids, self.lengths, self.sizes):
            array.finish()
        for t0, t1, s0, s1, d0, d1 in self.extents:
            yield TokenArrays(self.ids[t0:t1], self.lengths[s0:s1]), self.sizes[d0:d1]


def _hash_sets(digest: hashlib._Hash, reference_sets: Sequence[Sequence[str]]) -> None:
    """Feed reference sets to a running `corpus_sha256` digest."""
    for refs in reference_sets:
        for ref in refs:
            digest.update(ref.encode("utf-8"))
            digest.update(b"\x1f")
        digest.update(b"\x1e")


def _df_table(spilled: _SpilledBlocks, vocabulary: Vocabulary, n: int, sha: str) -> DocumentFrequency:
    """The document-frequency table of the spilled blocks' sentences grouped into documents (reference sets).

    Each block is cut into chunks of about `CHUNK_TOKENS` tokens; each chunk's (sorted n-gram keys, document
    counts) goes to a `_RunningTable`: memory holds the table and about one block, whatever the corpus's size
    (document counts are integers: the sums are exact, the table is the one of the whole corpus at once).
    """
    table = _RunningTable()
    for tokens, sizes in spilled.blocks():
        offsets = tokens.offsets
        set_start = np.concatenate([[0], np.cumsum(sizes)])
        bounds = chunk_bounds(offsets[set_start[1:]] - offsets[set_start[:-1]])
        for first, last in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            levels = ngram_levels(tokens.span(set_start[first], set_start[last], offsets), n, len(vocabulary))
            document = np.repeat(np.arange(last - first), sizes[first:last])
            keys, counts = document_counts(levels, document)
            del levels
            order = np.argsort(keys)
            table.add(keys[order], counts[order])
    keys, totals = table.result()
    dtype = np.int32 if spilled.num_sets < 2 ** 31 else np.int64
    return DocumentFrequency.from_arrays(vocabulary.words(), keys, totals.astype(dtype), float(spilled.num_sets), n,
                                         sha)


class _RunningTable:
    """Sums of (sorted, unique int64 keys, counts) chunks, kept per partition of the key space (the keys' top
    `PARTITION_BITS` bits, in signed order): a partition's pending pieces are summed into its part of the table
    when they outnumber it (at least `MERGE_KEYS` / partitions), so a merge touches a small, cache-sized part and
    the pending pieces never exceed the table (plus `MERGE_KEYS`)."""

    def __init__(self) -> None:
        parts = 1 << PARTITION_BITS
        shift = 64 - PARTITION_BITS
        self.bounds = np.array([(j - parts // 2) << shift for j in range(1, parts)], dtype=np.int64)
        self.keys = [np.zeros(0, dtype=np.int64) for _ in range(parts)]
        self.totals = [np.zeros(0, dtype=np.int64) for _ in range(parts)]
        self.pending: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(parts)]
        self.pending_keys = [0] * parts
        self.least = max(1, MERGE_KEYS // parts)

    def add(self, keys: np.ndarray, counts: np.ndarray) -> None:
        """Add one chunk (sorted, unique keys)."""
        cuts = [0, *np.searchsorted(keys, self.bounds).tolist(), len(keys)]
        for part, (low, high) in enumerate(itertools.pairwise(cuts)):
            if high > low:
                self.pending[part].append((keys[low:high].copy(), counts[low:high].astype(np.int64)))
                self.pending_keys[part] += high - low
                if self.pending_keys[part] >= max(len(self.keys[part]), self.least):
                    self._merge(part)

    def _merge(self, part: int) -> None:
        summed_keys, summed = _summed(self.pending[part])
        self.keys[part], self.totals[part] = _merged((self.keys[part], self.totals[part]), (summed_keys, summed))
        self.pending_keys[part] = 0

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """The whole table: sorted keys and int64 totals."""
        for part in range(len(self.keys)):
            if self.pending[part]:
                self._merge(part)
        keys, totals = np.concatenate(self.keys), np.concatenate(self.totals)
        self.keys, self.totals = [], []
        return keys, totals


def _summed(chunks: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """One (sorted keys, int64 totals) chunk summing `chunks` (each sorted, unique keys); empties `chunks`."""
    if len(chunks) == 1:
        keys, totals = chunks.pop()
        return keys, totals
    keys = np.concatenate([chunk_keys for chunk_keys, _ in chunks])
    counts = np.concatenate([chunk_counts for _, chunk_counts in chunks])
    chunks.clear()
    order = np.argsort(keys, kind="stable")
    keys, counts = keys[order], counts[order]
    starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))
    return keys[starts], np.add.reduceat(counts, starts) if len(keys) else counts


def _merged(table: tuple[np.ndarray, np.ndarray], chunk: tuple[np.ndarray, np.ndarray]
            ) -> tuple[np.ndarray, np.ndarray]:
    """`table` plus `chunk` (both sorted, unique keys): the keys already in the table add their counts in place,
    the others are inserted at their sorted places (one new array: about twice the table at the peak)."""
    keys, counts = chunk
    del chunk
    table_keys, table_totals = table
    del table
    if not len(table_keys):
        return keys, counts.astype(np.int64)
    at = np.searchsorted(table_keys, keys)
    hit = at < len(table_keys)
    hit[hit] = table_keys[at[hit]] == keys[hit]
    table_totals[at[hit]] += counts[hit].astype(np.int64)  # distinct keys: distinct places
    new = ~hit
    if not new.any():
        return table_keys, table_totals
    at_new = at[new]  # non-decreasing: each new key goes before the table key at its place
    shift = np.cumsum(np.bincount(at_new, minlength=len(table_keys) + 1))[:len(table_keys)]
    old_places = np.arange(len(table_keys), dtype=np.int64) + shift  # the table keys, moved past the new ones
    new_places = at_new + np.arange(len(at_new), dtype=np.int64)
    merged_keys = np.empty(len(table_keys) + len(at_new), dtype=table_keys.dtype)
    merged_keys[old_places], merged_keys[new_places] = table_keys, keys[new]
    del table_keys
    merged_totals = np.empty(len(merged_keys), dtype=np.int64)
    merged_totals[old_places], merged_totals[new_places] = table_totals, counts[new]
    return merged_keys, merged_totals