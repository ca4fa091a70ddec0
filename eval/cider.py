"""Fast CIDEr-D: pycocoevalcap's `Cider` (per-caption values equal to 1e-12), in NumPy with compact tables.

`cider_d` and `cider_df` PTB-tokenize their inputs first (the COCO protocol: lower-cased, punctuation removed,
pycocoevalcap's tokenizer; `tokenized=True` takes space-joined tokens as given); a `CiderD` scorer takes
tokenized, space-joined strings (`pacs.eval.tokenize.ptb_tokenize`), as the SCST reward passes them.
Document frequencies come either from the evaluated references (exactly what pycocoevalcap computes: one
document per entry of `references`) or from a fixed corpus (`cider_df`, the SCST convention: the training
references), which can be cached on disk. The statistics of the references of the last call are kept inside
a `CiderD` scorer, so scoring new candidates against the same references costs only the candidates' share.

Everything is arrays (`pacs.eval.ngram_index`, `pacs.eval.cider_tables`, `pacs.eval.cider_state`): word ids, int64 n-gram
keys, document frequencies and reference vectors, processed in chunks of bounded size, so time and memory
grow linearly with the number of captions. The score replicates pycocoevalcap 1.2 exactly, including its
quirks: the Gaussian length penalty uses the number of *bigrams* of each sentence (``len(words) - 1``),
n-grams missing from the document-frequency table get df = 1 (idf = log of the number of documents), and a
cosine with a zero norm keeps the raw sum.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from pacs.eval.cider_state import RefState, prepare_references, score_candidates
from pacs.eval.cider_tables import NGRAM_ORDER, DocumentFrequency, check_reference_sets, cider_df
from pacs.eval.ngram_index import Vocabulary, VocabularyFull, max_words
from pacs.eval.tokenize import check_ptb_tokenizer, ptb_tokenize_pairs
from pacs.metric.common.errors import InputError

#: the key of the CiderD scorer that `cider_d` keeps with a table (statistics prepared once, not every call)
KEPT_SCORER = "cider_d"

log = logging.getLogger(__name__)

SIGMA = 6.0

__all__ = ["NGRAM_ORDER", "SIGMA", "CiderD", "DocumentFrequency", "cider_corpus", "cider_d", "cider_df"]


@dataclass
class CiderD:
    """A CIDEr-D scorer that keeps the statistics of the last call's references (the SCST use case).

    `document_frequency=None` takes document frequencies from the references of each call (pycocoevalcap);
    a `DocumentFrequency` (or a path to a saved one) fixes them for every call. Reference sets above
    `max_cached_references` are not kept after a call.

    >>> from pacs.eval import CiderD, cider_df
    >>> refs = [["a dog running on grass", "the dog is in a field"], ["a man on a horse", "a rider and his horse"]]
    >>> scorer = CiderD(document_frequency=cider_df(refs + [["two cats sleep on a sofa"]]))
    >>> scorer(["a dog runs on the grass", "a man rides a horse"], refs).round(4).tolist()
    [1.5464, 2.0873]
    """

    document_frequency: DocumentFrequency | None = None
    n: int = NGRAM_ORDER
    sigma: float = SIGMA
    max_cached_references: int = 1_000_000
    _vocabulary: Vocabulary = field(init=False, repr=False, compare=False)
    _state: RefState | None = field(default=None, init=False, repr=False, compare=False)
    _state_key: list | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.document_frequency, (str, os.PathLike)):
            self.document_frequency = DocumentFrequency.load(self.document_frequency)
        if self.document_frequency is not None and self.document_frequency.n != self.n:
            raise InputError(f"document frequencies are for n={self.document_frequency.n}, scorer uses n={self.n}")
        self._reset()

    def _reset(self) -> None:
        """A fresh vocabulary (the fixed table's words first, so that their ids match its keys), no state."""
        table = self.document_frequency
        self._vocabulary = Vocabulary(table.words if table is not None else (), capacity=max_words(self.n))
        self._state, self._state_key = None, None

    def clear(self) -> None:
        """Forget the prepared reference statistics (the next call prepares its references again)."""
        self._state, self._state_key = None, None

    @property
    def nbytes(self) -> int:
        """Bytes held by the prepared reference statistics (0 when none are kept)."""
        return 0 if self._state is None else self._state.nbytes

    def _prepared(self, references: Sequence[Sequence[str]]) -> tuple[RefState, np.ndarray]:
        """The statistics of `references` (kept from the last call when they are the same) and the prepared set
        of each entry (repeated reference sets are prepared once)."""
        keys = [tuple(refs) for refs in references]
        index: dict[tuple, int] = {}
        set_index = np.fromiter((index.setdefault(key, len(index)) for key in keys), dtype=np.int64, count=len(keys))
        sets = list(index)
        state_key = sets if self.document_frequency is not None else keys
        if self._state is not None and self._state_key == state_key:
            return self._state, set_index
        multiplicity = None if self.document_frequency is not None else np.bincount(set_index)
        try:
            state = prepare_references(sets, multiplicity, self._vocabulary, self.n, self.document_frequency)
        except VocabularyFull:
            log.info("CIDEr-D vocabulary full: starting a new one for these references")
            self._reset()
            state = prepare_references(sets, multiplicity, self._vocabulary, self.n, self.document_frequency)
        keep = len(sets) <= self.max_cached_references
        self._state, self._state_key = (state, state_key) if keep else (None, None)
        return state, set_index

    def __call__(self, candidates: Sequence[str], references: Sequence[Sequence[str]]) -> np.ndarray:
        """Per-caption CIDEr-D of tokenized `candidates[i]` against tokenized `references[i]` (pycocoevalcap scale, ×10)."""
        check_inputs(candidates, references)
        if len(candidates) == 0:
            return np.zeros(0, dtype=np.float64)
        state, set_index = self._prepared(references)
        return score_candidates(state, list(candidates), set_index, self._vocabulary, self.sigma)


def check_inputs(candidates: Sequence[str], references: Sequence[Sequence[str]]) -> None:
    """InputError naming the first bad item unless `candidates` is a list of strings, one reference set each."""
    if isinstance(candidates, str):
        raise InputError("candidates must be a list of strings, not a single string")
    if len(candidates) != len(references):
        raise InputError(f"{len(candidates)} candidates but {len(references)} reference sets")
    check_reference_sets(references, "references")
    for index, candidate in enumerate(candidates):
        if not isinstance(candidate, str):
            raise InputError(f"candidates[{index}] is {type(candidate).__name__}, expected a string")


def cider_d(candidates: Sequence[str], references: Sequence[Sequence[str]],
            document_frequency: DocumentFrequency | str | os.PathLike | None = None,
            tokenized: bool = False, tokenizer: str = "python") -> np.ndarray:
    """Per-caption CIDEr-D (pycocoevalcap scale) of `candidates[i]` against `references[i]`.

    Captions are PTB-tokenized first as pycocoevalcap's evaluation does (`tokenizer`: "python", no Java, or "java",
    the jar), so "A dog, running." scores as "a dog running"; `tokenized=True` takes space-joined tokens as given.
    With a `DocumentFrequency` (built by `cider_df` with the same tokenization), one `CiderD` is kept on that
    table across calls (reference statistics cached); for other repeated uses keep a `CiderD` object yourself.

    >>> from pacs.eval import cider_d
    >>> cands = ["a dog runs on the grass", "a man rides a horse"]
    >>> refs = [["a dog running on grass", "the dog is in a field"], ["a man on a horse", "a rider and his horse"]]
    >>> scores = cider_d(cands, refs)
    >>> scores.round(4).tolist()
    [1.5464, 2.0065]
    >>> from pycocoevalcap.cider.cider import Cider  # the reference implementation
    >>> _, official = Cider().compute_score(dict(enumerate(refs)), {i: [c] for i, c in enumerate(cands)})
    >>> bool(abs(scores - official).max() < 1e-12)
    True
    >>> cider_d(["A dog runs on the grass!", "A man rides a horse."], refs).round(4).tolist()  # PTB: the same tokens
    [1.5464, 2.0065]
    >>> cider_d(["A dog runs on the grass!", "A man rides a horse."], refs, tokenized=True).round(4).tolist()
    [0.8183, 0.4419]
    """
    check_inputs(candidates, references)
    check_ptb_tokenizer(tokenizer)
    if not tokenized:
        candidates, references = ptb_tokenize_pairs(candidates, references, tokenizer)
    if isinstance(document_frequency, (str, os.PathLike)):
        document_frequency = DocumentFrequency.load(document_frequency)
    if document_frequency is None:
        return CiderD()(candidates, references)
    scorer = document_frequency.kept.get(KEPT_SCORER)
    if scorer is None:
        scorer = document_frequency.kept[KEPT_SCORER] = CiderD(document_frequency=document_frequency)
    return scorer(candidates, references)


def cider_corpus(scores: Iterable[float]) -> float:
    """Corpus CIDEr-D as pycocoevalcap reports it: the mean of the per-caption values."""
    values = np.asarray(list(scores), dtype=np.float64)
    return float(values.mean()) if len(values) else float("nan")
