"""Fast CIDEr-D: pycocoevalcap's `Cider` (per-caption values equal to 1e-6), vectorised with NumPy.

Inputs are tokenized, space-joined strings (run `eval.tokenize.ptb_tokenize` first for the COCO protocol).
Document frequencies come either from the evaluated references (exactly what pycocoevalcap computes: one
document per entry of `references`) or from a fixed corpus (`cider_df`, the SCST convention: the training
references), which can be cached on disk. N-gram statistics of every reference string are cached inside a
`CiderD` scorer, so SCST can score new candidates against the same references every step cheaply.

The score replicates pycocoevalcap 1.2 exactly, including its quirks: the Gaussian length penalty uses the
number of *bigrams* of each sentence (``len(words) - 1``), n-grams missing from the document-frequency table
get df = 1 (idf = log of the number of documents), and a cosine with a zero norm keeps the raw sum.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from eval.ngram_index import NgramIndex
from metric.common.errors import InputError
from metric.common.io import atomic_path

log = logging.getLogger(__name__)

NGRAM_ORDER = 4
SIGMA = 6.0
_FORMAT = "pacs-cider-df/1"


def sentence_grams(words: Sequence[str], n: int = NGRAM_ORDER) -> list:
    """All 1..n-gram occurrences of a word list: unigrams as strings, longer n-grams as tuples of words."""
    grams: list = list(words)
    for k in range(2, n + 1):
        grams.extend(zip(*(words[i:] for i in range(k))))
    return grams


def _gram_to_text(gram: str | tuple) -> str:
    """Serialise an n-gram key as space-joined words."""
    return gram if isinstance(gram, str) else " ".join(gram)


def _text_to_gram(text: str) -> str | tuple:
    """Inverse of `_gram_to_text`."""
    words = text.split(" ")
    return words[0] if len(words) == 1 else tuple(words)


@dataclass
class DocumentFrequency:
    """Document frequencies of n-grams over a corpus of reference sets, plus the number of documents.

    Built by `cider_df`; `save` / `load` keep it on disk (gzipped JSON with a `.gz` suffix):

    >>> import os, tempfile
    >>> from eval import DocumentFrequency, cider_df
    >>> table = cider_df([["a dog running on grass", "the dog is in a field"], ["a man on a horse"]])
    >>> table.num_documents, table.counts["dog"], table.counts[("a", "man")]
    (2.0, 1.0, 1.0)
    >>> path = os.path.join(tempfile.mkdtemp(), "df.json.gz")
    >>> table.save(path)
    >>> DocumentFrequency.load(path) == table
    True
    """

    counts: dict  # n-gram key (str for unigrams, tuple of words otherwise) -> number of documents
    num_documents: float
    n: int = NGRAM_ORDER
    corpus_sha256: str = ""
    #: the CiderD scorer that `cider_d` keeps for this table (interning a big table once, not every call)
    scorer: CiderD | None = field(default=None, repr=False, compare=False)

    @property
    def log_num_documents(self) -> float:
        """The `ref_len` of pycocoevalcap: log of the number of documents."""
        return float(np.log(float(self.num_documents)))

    def save(self, path: str | os.PathLike) -> None:
        """Write the table atomically as (optionally gzipped, by `.gz` suffix) JSON."""
        payload = {
            "format": _FORMAT,
            "n": self.n,
            "num_documents": self.num_documents,
            "corpus_sha256": self.corpus_sha256,
            "counts": {_gram_to_text(ngram): value for ngram, value in self.counts.items()},
        }
        data = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        with atomic_path(path) as tmp:
            if str(path).endswith(".gz"):
                with gzip.open(tmp, "wb") as handle:
                    handle.write(data)
            else:
                Path(tmp).write_bytes(data)

    @classmethod
    def load(cls, path: str | os.PathLike) -> DocumentFrequency:
        """Read a table written by `save`; a malformed file raises InputError naming it."""
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
        if not isinstance(payload, dict) or payload.get("format") != _FORMAT:
            raise InputError(f"{path}: not a pacs CIDEr document-frequency file (format {_FORMAT!r} expected)")
        counts = {_text_to_gram(key): float(value) for key, value in payload["counts"].items()}
        return cls(counts, float(payload["num_documents"]), int(payload["n"]), payload.get("corpus_sha256", ""))


def _corpus_sha256(reference_corpus: Sequence[Sequence[str]]) -> str:
    """Hash a corpus of reference sets (order and content) to validate a disk cache."""
    digest = hashlib.sha256()
    for refs in reference_corpus:
        for ref in refs:
            digest.update(ref.encode("utf-8"))
            digest.update(b"\x1f")
        digest.update(b"\x1e")
    return digest.hexdigest()


def _check_reference_sets(references: Sequence[Sequence[str]], what: str) -> None:
    """Raise InputError when a reference set is a bare string or empty."""
    for index, refs in enumerate(references):
        if isinstance(refs, str):
            raise InputError(f"{what}[{index}] is a string; expected a list of reference sentences")
        if len(refs) == 0:
            raise InputError(f"{what}[{index}] has no references")


def cider_df(reference_corpus: Sequence[Sequence[str]], n: int = NGRAM_ORDER,
             cache_path: str | os.PathLike | None = None) -> DocumentFrequency:
    """Document frequencies over `reference_corpus` (one document = one image's list of references).

    With `cache_path`, a table previously saved for the same corpus (sha256 match) is loaded instead of
    recomputed, and a freshly computed table is saved there. Inputs are tokenized, space-joined strings.

    >>> from eval import cider_d, cider_df
    >>> train = [["a dog running on grass", "the dog is in a field"], ["a man on a horse", "a rider and his horse"],
    ...          ["two cats sleep on a sofa"]]
    >>> df = cider_df(train)  # cider_df(train, cache_path="df.json.gz") also caches it on disk
    >>> df.num_documents
    3.0
    >>> cider_d(["a man rides a horse"], [["a man on a horse", "a rider and his horse"]],
    ...         document_frequency=df).round(4).tolist()  # fixed frequencies (the SCST reward's)
    [2.0873]
    """
    _check_reference_sets(reference_corpus, "reference_corpus")
    sha = _corpus_sha256(reference_corpus)
    if cache_path is not None and Path(cache_path).is_file():
        cached = DocumentFrequency.load(cache_path)
        if cached.corpus_sha256 == sha and cached.n == n:
            log.info("CIDEr document frequencies loaded from %s", cache_path)
            return cached
        log.info("CIDEr document-frequency cache %s is for another corpus; recomputing", cache_path)
    counts: Counter = Counter()
    for refs in reference_corpus:
        counts.update({gram for ref in refs for gram in sentence_grams(ref.split(), n)})
    table = DocumentFrequency({k: float(v) for k, v in counts.items()}, float(len(reference_corpus)), n, sha)
    if cache_path is not None:
        table.save(cache_path)
    return table


@dataclass
class _Batch:
    """Flat n-gram statistics of a batch of sentences, sorted by (sentence, n-gram id)."""

    owner: np.ndarray  # sentence index of each entry
    ids: np.ndarray  # global n-gram id; >= index size for a gram unknown to the index (candidates only)
    counts: np.ndarray
    orders: np.ndarray  # 0-based order (n-gram length - 1)
    lengths: np.ndarray  # pycocoevalcap's length: number of bigrams of each sentence


@dataclass
class CiderD:
    """A CIDEr-D scorer that caches reference n-gram statistics across calls (the SCST use case).

    `document_frequency=None` takes document frequencies from the references of each call (pycocoevalcap);
    a `DocumentFrequency` (or a path to a saved one) fixes them for every call.

    >>> from eval import CiderD, cider_df
    >>> refs = [["a dog running on grass", "the dog is in a field"], ["a man on a horse", "a rider and his horse"]]
    >>> scorer = CiderD(document_frequency=cider_df(refs + [["two cats sleep on a sofa"]]))
    >>> scorer(["a dog runs on the grass", "a man rides a horse"], refs).round(4).tolist()
    [1.5464, 2.0873]
    """

    document_frequency: DocumentFrequency | None = None
    n: int = NGRAM_ORDER
    sigma: float = SIGMA
    max_cached_references: int = 1_000_000  # reference sets kept in the statistics cache
    _index: NgramIndex | None = field(default=None, repr=False)
    _ref_cache: dict = field(default_factory=dict, repr=False)
    _fixed_df: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)
    _df_cache: tuple = field(default=(None, None), repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.document_frequency, (str, os.PathLike)):
            self.document_frequency = DocumentFrequency.load(self.document_frequency)
        if self.document_frequency is not None and self.document_frequency.n != self.n:
            raise InputError(f"document frequencies are for n={self.document_frequency.n}, scorer uses n={self.n}")
        self._index = NgramIndex(self.n)
        if self.document_frequency is not None:
            self._intern_table(self.document_frequency)

    def _intern_table(self, table: DocumentFrequency) -> None:
        """Give every n-gram of the fixed table an id, so that an unknown id means df = 0."""
        grams = list(table.counts)
        splits = [[gram] if isinstance(gram, str) else list(gram) for gram in grams]
        occ = self._index.occurrences(splits, grow=True)
        whole = (occ.position == 0) & (occ.order == occ.lengths[occ.owner] - 1)
        df = np.zeros(self._index.size)
        values = np.fromiter(table.counts.values(), dtype=np.float64, count=len(grams))
        df[occ.gid[whole]] = values[occ.owner[whole]]
        self._fixed_df = df

    # -- statistics -------------------------------------------------------------------------------------
    def _batch(self, sentences: Sequence[str], grow: bool) -> _Batch:
        """N-gram statistics of many sentences at once; references extend the index, candidates do not."""
        occ = self._index.occurrences([sentence.split() for sentence in sentences], grow)
        size = self._index.size
        ids = np.where(occ.gid >= 0, occ.gid, size + occ.local)
        width = max(size + occ.num_local, 1)
        keys, counts = np.unique(occ.owner * width + ids, return_counts=True)
        ids = keys % width
        known = ids < size
        orders = np.empty(len(ids), dtype=np.int64)
        orders[known] = self._index.orders[ids[known]]
        orders[~known] = occ.local_orders[ids[~known] - size]
        return _Batch(keys // width, ids, counts.astype(np.float64), orders, np.maximum(occ.lengths - 1, 0))

    def _reference_batch(self, references: Sequence[Sequence[str]]) -> _Batch:
        """Statistics of every reference of every set, from a cache keyed by reference set (filled on demand)."""
        cache = self._ref_cache
        keys = [tuple(group) for group in references]
        missing_sets = list(dict.fromkeys(key for key in keys if key not in cache))
        if missing_sets:
            if len(cache) + len(missing_sets) > self.max_cached_references:
                cache.clear()
                missing_sets = list(dict.fromkeys(keys))
            sentences = list(dict.fromkeys(ref for key in missing_sets for ref in key))
            fresh = self._batch(sentences, grow=True)
            bounds = np.searchsorted(fresh.owner, np.arange(len(sentences) + 1))
            position = {sentence: index for index, sentence in enumerate(sentences)}
            for key in missing_sets:
                rows = [position[ref] for ref in key]
                slices = [slice(bounds[row], bounds[row + 1]) for row in rows]
                sizes = np.array([sl.stop - sl.start for sl in slices], dtype=np.int64)
                cache[key] = (np.concatenate([fresh.ids[sl] for sl in slices]),
                              np.concatenate([fresh.counts[sl] for sl in slices]),
                              np.concatenate([fresh.orders[sl] for sl in slices]),
                              sizes, fresh.lengths[rows])
        entries = [cache[key] for key in keys]
        sizes = np.concatenate([e[3] for e in entries])
        return _Batch(
            np.repeat(np.arange(len(sizes), dtype=np.int64), sizes),
            np.concatenate([e[0] for e in entries]),
            np.concatenate([e[1] for e in entries]),
            np.concatenate([e[2] for e in entries]),
            np.concatenate([e[4] for e in entries]),
        )

    def _log_df_fixed(self) -> np.ndarray:
        """log(max(1, df)) for every index id under the fixed table (n-grams added later have df = 0)."""
        if len(self._fixed_df) < self._index.size:
            self._fixed_df = np.concatenate([self._fixed_df, np.zeros(self._index.size - len(self._fixed_df))])
        return np.log(np.maximum(1.0, self._fixed_df))

    def _log_df_from_references(self, refs: _Batch, ref_counts: np.ndarray,
                                cache_key: int) -> tuple[np.ndarray, float]:
        """log(max(1, df)) per vocabulary id with one document per reference set of this call."""
        if self._df_cache[0] == cache_key and len(self._df_cache[1][0]) == self._index.size:
            return self._df_cache[1]
        vocab_size = max(self._index.size, 1)
        document = np.repeat(np.arange(len(ref_counts)), ref_counts)[refs.owner]
        unique_keys = np.unique(document * vocab_size + refs.ids)
        df = np.bincount(unique_keys % vocab_size, minlength=vocab_size).astype(np.float64)
        result = (np.log(np.maximum(1.0, df)), float(np.log(float(len(ref_counts)))))
        self._df_cache = (cache_key, result)
        return result

    # -- scoring ----------------------------------------------------------------------------------------
    def __call__(self, candidates: Sequence[str], references: Sequence[Sequence[str]]) -> np.ndarray:
        """Per-caption CIDEr-D of `candidates[i]` against `references[i]` (pycocoevalcap scale, ×10)."""
        if isinstance(candidates, str):
            raise InputError("candidates must be a list of strings, not a single string")
        if len(candidates) != len(references):
            raise InputError(f"{len(candidates)} candidates but {len(references)} reference sets")
        _check_reference_sets(references, "references")
        for index, candidate in enumerate(candidates):
            if not isinstance(candidate, str):
                raise InputError(f"candidates[{index}] is {type(candidate).__name__}, expected a string")
        if len(candidates) == 0:
            return np.zeros(0, dtype=np.float64)
        n = self.n
        ref_counts = np.fromiter(map(len, references), dtype=np.int64, count=len(references))
        refs = self._reference_batch(references)
        cands = self._batch(candidates, grow=False)
        vocab_size = self._index.size
        num_refs = len(refs.lengths)

        if self.document_frequency is None:
            key = hash(tuple(map(tuple, references)))
            log_df, ref_len = self._log_df_from_references(refs, ref_counts, key)
        else:
            log_df, ref_len = self._log_df_fixed(), self.document_frequency.log_num_documents

        # reference vectors (one per reference occurrence p) and their norms per order
        r_weight = refs.counts * (ref_len - log_df[refs.ids])
        r_norm = np.sqrt(np.bincount(refs.owner * n + refs.orders, weights=r_weight ** 2,
                                     minlength=num_refs * n)).reshape(num_refs, n)
        # candidate vectors
        known = cands.ids < vocab_size
        c_log_df = np.empty(len(cands.ids))
        c_log_df[known] = log_df[cands.ids[known]]
        c_log_df[~known] = 0.0  # absent from the index, hence from every document
        c_weight = cands.counts * (ref_len - c_log_df)
        c_norm = np.sqrt(np.bincount(cands.owner * n + cands.orders, weights=c_weight ** 2,
                                     minlength=len(candidates) * n)).reshape(len(candidates), n)

        # pair every known candidate entry with each reference of its image (pair-major, so the join keys
        # come out sorted); join on (reference occurrence p, n-gram id)
        pair_cand = np.repeat(np.arange(len(candidates), dtype=np.int64), ref_counts)  # p -> i
        k_owner = cands.owner[known]
        k_ids, k_weight, k_orders = cands.ids[known], c_weight[known], cands.orders[known]
        k_sizes = np.bincount(k_owner, minlength=len(candidates))
        k_start = np.cumsum(k_sizes) - k_sizes
        pair_sizes = k_sizes[pair_cand]
        e_pair = np.repeat(np.arange(num_refs, dtype=np.int64), pair_sizes)
        e_entry = np.repeat(k_start[pair_cand] - (np.cumsum(pair_sizes) - pair_sizes), pair_sizes) + np.arange(
            len(e_pair), dtype=np.int64)
        width = max(vocab_size, 1)
        r_keys = refs.owner * width + refs.ids  # sorted: owners ascending, ids ascending within an owner
        e_keys = e_pair * width + k_ids[e_entry]
        value = np.zeros(num_refs * n)
        if len(r_keys) and len(e_keys):
            where = np.minimum(np.searchsorted(r_keys, e_keys), len(r_keys) - 1)
            hit = np.flatnonzero(r_keys[where] == e_keys)
            matched = r_weight[where[hit]]
            hit_entry = e_entry[hit]
            contribution = np.minimum(k_weight[hit_entry], matched) * matched
            value = np.bincount(e_pair[hit] * n + k_orders[hit_entry], weights=contribution,
                                minlength=num_refs * n)
        value = value.reshape(num_refs, n)
        denominator = c_norm[pair_cand] * r_norm
        nonzero = denominator != 0
        value = np.where(nonzero, value / np.where(nonzero, denominator, 1.0), value)
        delta = (cands.lengths[pair_cand] - refs.lengths).astype(np.float64)
        value = value * np.exp(-(delta ** 2) / (2 * self.sigma ** 2))[:, None]
        per_candidate = np.bincount(pair_cand, weights=value.mean(axis=1), minlength=len(candidates))
        return per_candidate / ref_counts * 10.0


def cider_d(candidates: Sequence[str], references: Sequence[Sequence[str]],
            document_frequency: DocumentFrequency | str | os.PathLike | None = None) -> np.ndarray:
    """Per-caption CIDEr-D (pycocoevalcap scale) of tokenized `candidates[i]` against `references[i]`.

    With a `DocumentFrequency`, one `CiderD` is kept on that table across calls (reference statistics cached);
    for other repeated uses keep a `CiderD` object yourself.

    >>> from eval import cider_d
    >>> cands = ["a dog runs on the grass", "a man rides a horse"]
    >>> refs = [["a dog running on grass", "the dog is in a field"], ["a man on a horse", "a rider and his horse"]]
    >>> scores = cider_d(cands, refs)
    >>> scores.round(4).tolist()
    [1.5464, 2.0065]
    >>> from pycocoevalcap.cider.cider import Cider  # the reference implementation
    >>> _, official = Cider().compute_score(dict(enumerate(refs)), {i: [c] for i, c in enumerate(cands)})
    >>> bool(abs(scores - official).max() < 1e-6)
    True
    """
    if isinstance(document_frequency, (str, os.PathLike)):
        document_frequency = DocumentFrequency.load(document_frequency)
    if document_frequency is None:
        return CiderD()(candidates, references)
    if document_frequency.scorer is None:
        document_frequency.scorer = CiderD(document_frequency=document_frequency)
    return document_frequency.scorer(candidates, references)


def cider_corpus(scores: Iterable[float]) -> float:
    """Corpus CIDEr-D as pycocoevalcap reports it: the mean of the per-caption values."""
    values = np.asarray(list(scores), dtype=np.float64)
    return float(values.mean()) if len(values) else float("nan")
