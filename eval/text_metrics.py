"""Reference-based text metrics through pycocoevalcap (BLEU-1..4, METEOR, ROUGE-L, SPICE) and fast CIDEr-D.

`compute_text_metrics` tokenizes every caption with one PTB-tokenizer call (the Python one by default: BLEU,
ROUGE-L and CIDEr-D need no Java; `tokenizer="java"` runs pycocoevalcap's jar), scores each distinct
(candidate, references) pair once (per-caption values do not depend on the other pairs, except CIDEr's document
frequencies, which are computed over all rows exactly as pycocoevalcap does) and returns corpus and
per-caption values in input order.

Java starts once per JVM program a call needs (METEOR; SPICE; the PTB tokenizer when `tokenizer="java"`).
Inside a `TextMetricSession` (`with TextMetricSession(): ...`, e.g. around every evaluation of a training run) the
calls share one METEOR process and a memo of PTB tokenisations (a caption's tokens do not depend on the other captions of the batch),
so a second call on the same references, or a subset of captions already scored, starts no Java at all for
them; values are unchanged. METEOR runs pycocoevalcap's jar through `pacs.eval.meteor_stats.MeteorStats` (the
same requests, the same values): a jar that dies is one error naming the caption, never a hang, and captions
too long for it are refused before it starts.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from contextvars import ContextVar, Token
from dataclasses import dataclass
from types import TracebackType
from typing import Self

import numpy as np
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.rouge.rouge import Rouge

from pacs.eval.cider import CiderD
from pacs.eval.java_runtime import require_java
from pacs.eval.meteor_stats import MeteorStats, caption_label, check_meteor_lengths
from pacs.eval.registry import get_metric
from pacs.eval.spice import SpiceUnavailable, compute_spice
from pacs.eval.tokenize import check_ptb_tokenizer, ptb_tokenize, ptb_tokenize_pairs
from pacs.metric.common.errors import InputError

log = logging.getLogger(__name__)


@dataclass
class MetricValues:
    """Corpus value and per-caption values (input order) of one metric; `available=False` with a reason.

    `failed` lists the rows (input order) the metric could not score (SPICE only): their per-caption value is NaN
    and the corpus value is over the other rows.
    """

    corpus: float
    per_caption: np.ndarray
    available: bool = True
    reason: str = ""
    failed: tuple[int, ...] = ()

    @property
    def n_failed(self) -> int:
        """How many rows the metric failed on."""
        return len(self.failed)


def check_pairs(candidates: Sequence[str], references: Sequence[Sequence[str]]) -> int:
    """Validate candidate/reference lists (named by index); return the number of empty candidates."""
    if isinstance(candidates, str):
        raise InputError("candidates must be a list of strings, not a single string")
    if len(candidates) != len(references):
        raise InputError(f"{len(candidates)} candidates but {len(references)} reference lists")
    empty = 0
    for index, (candidate, refs) in enumerate(zip(candidates, references)):
        if not isinstance(candidate, str):
            raise InputError(f"candidate {index} is {type(candidate).__name__}, expected a string")
        if isinstance(refs, str) or not refs:
            raise InputError(f"candidate {index} has no reference list (got {refs!r})")
        for ref in refs:
            if not isinstance(ref, str):
                raise InputError(f"a reference of candidate {index} is {type(ref).__name__}, expected a string")
        empty += not candidate.strip()
    return empty


class TextMetricSession:
    """Java work shared by the text-metric calls made while it is active: one METEOR process, a PTB memo.

    Use it as a context manager (`with TextMetricSession():`); `compute_text_metrics` uses the innermost active
    session, or one of its own for the duration of a single call. `java_starts` counts the JVMs it started.
    `tokenizer` is the PTB tokenizer of its calls: "python" (default, no Java) or "java".
    """

    def __init__(self, max_memo: int = 2_000_000, tokenizer: str = "python") -> None:
        self.max_memo = max_memo
        self.tokenizer = check_ptb_tokenizer(tokenizer)
        self.java_starts = 0
        self._tokens: dict[str, str] = {}
        self._meteor: MeteorStats | None = None
        self._token: Token | None = None

    def tokenize(self, captions: Sequence[str]) -> list[str]:
        """PTB tokens of `captions` (one tokenizer call for the strings not tokenized before in this session)."""
        todo = [c for c in dict.fromkeys(captions) if c not in self._tokens]
        if todo:
            if len(self._tokens) + len(todo) > self.max_memo:
                self._tokens.clear()  # bounded: start over rather than grow
            self._tokens.update(zip(todo, ptb_tokenize(todo, self.tokenizer)))
            self.java_starts += self.tokenizer == "java"
        return [self._tokens[c] for c in captions]

    def meteor(self, gts: dict, res: dict, labels: dict | None = None) -> tuple[float, list[float]]:
        """pycocoevalcap METEOR (`compute_score`) through the session's one METEOR process (`labels[key]` names a
        caption if the jar dies on it: the error is one line, and the next call starts a new jar)."""
        if self._meteor is None:
            self._meteor = MeteorStats()
            self.java_starts += 1
        try:
            return self._meteor.compute_score(gts, res, labels)
        except BaseException:  # a dead (or interrupted) jar is never asked again
            meteor, self._meteor = self._meteor, None
            meteor.close()
            raise

    def close(self) -> None:
        """Stop the METEOR process and forget the memo."""
        meteor, self._meteor = self._meteor, None
        if meteor is not None:
            meteor.close()
        self._tokens.clear()

    def __enter__(self) -> Self:
        self._token = _ACTIVE.set(self)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self._token is not None:
            _ACTIVE.reset(self._token)
            self._token = None
        self.close()


_ACTIVE: ContextVar[TextMetricSession | None] = ContextVar("pacs_text_metric_session", default=None)


def active_session() -> TextMetricSession | None:
    """The innermost `TextMetricSession` entered in this context, if any."""
    return _ACTIVE.get()


def tokenize_pairs(candidates: Sequence[str], references: Sequence[Sequence[str]],
                   session: TextMetricSession | None = None) -> tuple[list[str], list[list[str]]]:
    """PTB-tokenize candidates and references with a single tokenizer call (distinct strings only; none for the
    strings `session` has tokenized before; the Python tokenizer without a session)."""
    if session is None:
        return ptb_tokenize_pairs(candidates, references)
    flat = [*candidates, *(ref for refs in references for ref in refs)]
    tokenized = dict(zip(flat, session.tokenize(flat)))
    return [tokenized[c] for c in candidates], [[tokenized[r] for r in refs] for refs in references]


def _scatter(values: Sequence[float], inverse: np.ndarray) -> np.ndarray:
    """Per-row values from values of the distinct pairs."""
    return np.asarray(values, dtype=np.float64)[inverse]


def compute_text_metrics(candidates: Sequence[str], references: Sequence[Sequence[str]],
                         metrics: Sequence[str], tokenized: bool = False,
                         spice_corenlp: str | os.PathLike | None = None,
                         session: TextMetricSession | None = None, tokenizer: str | None = None,
                         ids: Sequence[object] | None = None) -> dict[str, MetricValues]:
    """Corpus and per-caption values of the text `metrics` (bleu1-4, meteor, rouge, cider, spice).

    Inputs are raw captions (PTB-tokenized here) unless `tokenized`. Corpus values are pycocoevalcap's
    (corpus BLEU, METEOR's aggregate, mean ROUGE-L / CIDEr-D / SPICE) over the distinct pairs. When the CoreNLP
    jars are missing, SPICE comes back with `available=False` and the reason instead of failing the run.
    Java is needed by METEOR and SPICE only (jars), and by the PTB tokenization when `tokenizer="java"`; the
    default PTB tokenizer is the Python one (`pacs.eval.ptb`, equal to Java's on the shared data sets). `session`
    (default: the active `TextMetricSession`, else one for this call with `tokenizer`, default "python") shares
    METEOR's process and PTB tokens between calls; a session's own tokenizer is used for its calls. `ids` (one per
    row) name captions in errors (default: `candidate ROW`); with METEOR, a caption or reference of more than
    `pacs.eval.meteor_stats.MAX_METEOR_WORDS` words is refused before anything is scored.

    >>> from pacs.eval import compute_text_metrics
    >>> refs = [["a dog running on grass", "the dog is in a field"], ["a man on a horse", "a rider and his horse"]]
    >>> values = compute_text_metrics(["A dog runs on the grass.", "A man rides a horse."], refs,
    ...                               ["bleu1", "rouge", "cider"])
    >>> {name: round(value.corpus, 4) for name, value in values.items()}  # pycocoevalcap's corpus values
    {'bleu1': 0.8182, 'rouge': 0.7697, 'cider': 1.7764}
    >>> values["cider"].per_caption.round(4).tolist()
    [1.5464, 2.0065]
    """
    names = [get_metric(name).name for name in metrics]
    for name in names:
        if get_metric(name).kind != "text":
            raise InputError(f"{name} is not a text metric (text metrics: bleu1-4 meteor rouge cider spice)")
    empty = check_pairs(candidates, references)
    if empty:
        log.warning("%d empty candidate(s) are scored as empty strings", empty)
    if not candidates:
        return {name: MetricValues(float("nan"), np.zeros(0)) for name in names}
    if tokenizer is not None:
        check_ptb_tokenizer(tokenizer)
    session = session or active_session()
    java_tokenizer = not tokenized and (session.tokenizer if session is not None else tokenizer) == "java"
    if any(get_metric(name).needs_java for name in names) or java_tokenizer:
        require_java([n for n in names if get_metric(n).needs_java] or ["the Java PTB tokenizer"])
    if session is None:
        with TextMetricSession(tokenizer=tokenizer or "python") as own:
            return _compute(candidates, references, names, tokenized, spice_corenlp, own, ids)
    return _compute(candidates, references, names, tokenized, spice_corenlp, session, ids)


def _compute(candidates: Sequence[str], references: Sequence[Sequence[str]], names: list[str], tokenized: bool,
             spice_corenlp: str | os.PathLike | None, session: TextMetricSession,
             ids: Sequence[object] | None = None) -> dict[str, MetricValues]:
    """`compute_text_metrics` of checked, non-empty inputs, with `session`'s Java processes."""
    if not tokenized:
        candidates, references = tokenize_pairs(candidates, references, session)
    if "meteor" in names:  # what the jar would align, before any metric runs
        check_meteor_lengths(candidates, references, ids)
    rows = [(c, tuple(r)) for c, r in zip(candidates, references)]
    distinct = list(dict.fromkeys(rows))
    position = {pair: i for i, pair in enumerate(distinct)}
    inverse = np.fromiter((position[row] for row in rows), dtype=np.int64, count=len(rows))
    gts = {i: list(refs) for i, (_, refs) in enumerate(distinct)}
    res = {i: [cand] for i, (cand, _) in enumerate(distinct)}
    out: dict[str, MetricValues] = {}

    bleu_orders = [int(name[-1]) for name in names if name.startswith("bleu")]
    if bleu_orders:
        corpus, per = Bleu(4).compute_score(gts, res, verbose=0)
        for k in bleu_orders:
            out[f"bleu{k}"] = MetricValues(float(corpus[k - 1]), _scatter(per[k - 1], inverse))
    if "meteor" in names:
        first_row = {pair: row for row, pair in reversed(list(enumerate(rows)))}
        labels = {i: caption_label(ids, first_row[pair]) for i, pair in enumerate(distinct)}
        corpus, per = session.meteor(gts, res, labels)
        out["meteor"] = MetricValues(float(corpus), _scatter(per, inverse))
    if "rouge" in names:
        corpus, per = Rouge().compute_score(gts, res)
        out["rouge"] = MetricValues(float(corpus), _scatter(per, inverse))
    if "cider" in names:
        # document frequencies over every row, as pycocoevalcap would count them
        per = CiderD()(list(candidates), [list(refs) for refs in references])
        out["cider"] = MetricValues(float(per.mean()), per)
    if "spice" in names:
        try:
            result = compute_spice([c for c, _ in distinct], [list(r) for _, r in distinct], spice_corenlp)
            failed_pairs = set(result.failed)
            failed_rows = tuple(int(row) for row in np.flatnonzero([pair in failed_pairs for pair in inverse]))
            out["spice"] = MetricValues(result.corpus, _scatter(result.per_caption, inverse), failed=failed_rows)
        except SpiceUnavailable as error:
            log.warning("%s", error)
            out["spice"] = MetricValues(float("nan"), np.full(len(rows), np.nan), False, str(error))
    return {name: out[name] for name in names}
