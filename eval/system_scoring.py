"""Scoring the rows of one captioning system with every metric, with state shared across systems.

`SharedScoring` holds what every system of a table shares: the PTB tokenization (one Java call for every
caption and reference of every system), one CIDEr-D scorer per reference configuration (its document
frequencies and reference statistics are prepared once, `pacs.eval.cider.CiderD`), one contrastive Scorer per metric
(each image is encoded once for all systems; the text cache is cleared between systems so that every system's
captions are embedded in the same batches as in a run of that system alone) and the grammar checker.
`score_rows` gives, for one system, the table's values (exactly what `pacs evaluate` prints for it alone) and
the per-caption values and BLEU statistics the bootstrap resamples.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pacs.eval.registry import get_metric
from pacs.metric.common.errors import InputError, PacsError

log = logging.getLogger(__name__)

BLEU_TINY, BLEU_SMALL = 1e-15, 1e-9  # pycocoevalcap's BleuScorer constants


@dataclass
class ScoringOptions:
    """What to score and with which resources (the `pacs evaluate` options besides the inputs)."""

    metrics: list[str]
    images: Path | None = None
    image_map: dict[str, str] | None = None
    skip_missing_images: bool = False
    spice_corenlp: str | None = None
    grammar_backend: str = "harper"
    languagetool_jar_dir: str | None = None
    languagetool_url: str | None = None
    ptb_tokenizer: str = "python"  # the text metrics' PTB tokenizer: "python" (no Java) or "java" (pycocoevalcap's)
    tokenized: bool = False  # the captions and references are space-joined tokens already: no PTB tokenization


@dataclass
class BleuStats:
    """pycocoevalcap's BLEU sufficient statistics per caption: lengths (closest reference) and n-gram counts."""

    testlen: np.ndarray
    reflen: np.ndarray
    guess: np.ndarray  # [captions, 4]
    correct: np.ndarray  # [captions, 4]


def bleu_stats(candidates: Sequence[str], references: Sequence[Sequence[str]]) -> BleuStats:
    """The statistics pycocoevalcap's `BleuScorer` cooks for tokenized candidates (reference length: closest)."""
    from pycocoevalcap.bleu.bleu_scorer import BleuScorer

    scorer = BleuScorer(n=4)
    for candidate, refs in zip(candidates, references):
        scorer += (candidate, list(refs))
    tests = scorer.ctest
    testlen = np.array([c["testlen"] for c in tests], dtype=np.float64)
    reflen = np.array([min((abs(length - c["testlen"]), length) for length in c["reflen"])[1] for c in tests],
                      dtype=np.float64)
    guess = np.array([c["guess"] for c in tests], dtype=np.float64).reshape(len(tests), 4)
    correct = np.array([c["correct"] for c in tests], dtype=np.float64).reshape(len(tests), 4)
    return BleuStats(testlen, reflen, guess, correct)


def corpus_bleu(stats: BleuStats, indices: np.ndarray | None = None) -> np.ndarray:
    """Corpus BLEU-1..4 of the captions `indices` (all when None; repeats count), pycocoevalcap's formula."""
    pick = slice(None) if indices is None else indices
    testlen, reflen = stats.testlen[pick].sum(), stats.reflen[pick].sum()
    guess, correct = stats.guess[pick].sum(axis=0), stats.correct[pick].sum(axis=0)
    bleus, bleu = [], 1.0
    for k in range(4):
        bleu *= float(correct[k] + BLEU_TINY) / (guess[k] + BLEU_SMALL)
        bleus.append(bleu ** (1.0 / (k + 1)))
    ratio = (testlen + BLEU_TINY) / (reflen + BLEU_SMALL)
    if ratio < 1:
        bleus = [value * float(np.exp(1 - 1 / ratio)) for value in bleus]
    return np.asarray(bleus)


@dataclass
class RowScores:
    """One system's table values and what its bootstrap needs."""

    values: dict[str, float | None]
    per_row: dict[str, np.ndarray] = field(default_factory=dict)  # per-caption values (NaN: not scored)
    bleu: BleuStats | None = None
    unavailable: dict[str, str] = field(default_factory=dict)
    failed: dict[str, tuple[int, ...]] = field(default_factory=dict)  # rows a metric could not score
    grammar_backend: str | None = None
    n_empty: int = 0
    n_rows: int = 0
    tokens: tuple[list[str], list[list[str]]] | None = None  # PTB-tokenized captions and references
    #: per contrastive metric, how many of the row's scored captions were cut to the model's text context
    #: (with long_captions="chunk": those holding a sentence longer than the context)
    truncated: dict[str, int] = field(default_factory=dict)


class SharedScoring:
    """Tokens, CIDEr-D scorers, contrastive scorers and the grammar checker shared by every system of a table."""

    def __init__(self, options: ScoringOptions, scorer_factory: Callable[[str], Any] | None = None,
                 tokenizer: Callable[[list[str]], list[str]] | None = None) -> None:
        from pacs.eval.caption_scoring import MetricSuite

        self.options = options
        self.tokenizer = tokenizer  # None: pycocoevalcap's PTB tokenization (options.ptb_tokenizer: python / java)
        self.metrics = list(options.metrics)
        self._tokens: dict[str, str] = {}
        self._cider: dict[str, Any] = {}
        self._checker: Any = None
        self._checker_error: str | None = None
        #: why SPICE is unavailable, once known (tried, and warned about, once per table, not once per row)
        self.spice_unavailable: str | None = None
        contrastive = [m for m in self.metrics if get_metric(m).kind == "contrastive"]
        self.suite = MetricSuite(contrastive, scorer_factory) if contrastive else None

    @property
    def needs_tokens(self) -> bool:
        """True when a text metric (PTB-tokenized) is requested."""
        return any(get_metric(m).kind == "text" for m in self.metrics)

    def tokenize(self, strings: Sequence[str]) -> None:
        """PTB-tokenize every string not seen yet, in one call of `pacs.eval.tokenize.ptb_tokenize` (the options'
        tokenizer: Python by default, or Java's), or with the caller's `tokenizer` (one verified equal to it on the
        caller's texts, e.g. the demo world's)."""
        from pacs.eval.tokenize import ptb_tokenize

        todo = list(dict.fromkeys(s for s in strings if s not in self._tokens))
        if todo:
            if self.options.tokenized:
                tokens = todo
            elif self.tokenizer:
                tokens = self.tokenizer(todo)
            else:
                tokens = ptb_tokenize(todo, self.options.ptb_tokenizer)
            self._tokens.update(zip(todo, tokens))

    def tokens(self, strings: Sequence[str]) -> list[str]:
        """The tokenized strings (tokenizing the unseen ones first)."""
        self.tokenize(strings)
        return [self._tokens[s] for s in strings]

    def cider(self, reference_key: str) -> Any:
        """The CIDEr-D scorer of a reference configuration (document frequencies from those references)."""
        from pacs.eval.cider import CiderD

        if reference_key not in self._cider:
            self._cider[reference_key] = CiderD()
        return self._cider[reference_key]

    def grammar_checker(self) -> Any:
        """The grammar checker (built once); a missing optional backend is a PacsError kept as the reason."""
        from pacs.eval.grammar import build_grammar_checker

        if self._checker is None and self._checker_error is None:
            try:
                self._checker = build_grammar_checker(self.options.grammar_backend,
                                                      jar_dir=self.options.languagetool_jar_dir,
                                                      url=self.options.languagetool_url)
            except InputError:
                raise
            except PacsError as error:  # a missing optional backend must not sink the whole table
                self._checker_error = str(error)
        if self._checker is None:
            raise PacsError(self._checker_error or "grammar backend unavailable")
        return self._checker


def _text_scores(shared: SharedScoring, captions: list[str], references: list[list[str]], reference_key: str,
                 out: RowScores, ids: Sequence[str]) -> None:
    """BLEU, METEOR, ROUGE-L, SPICE (pycocoevalcap) and CIDEr-D (the shared scorer) into `out`."""
    from pacs.eval.text_metrics import compute_text_metrics

    text = [m for m in shared.metrics if get_metric(m).kind == "text"]
    if not text:
        return
    tokenized_captions = shared.tokens(captions)
    tokenized_refs = [shared.tokens(refs) for refs in references]
    out.tokens = (tokenized_captions, tokenized_refs)
    others = [m for m in text if m != "cider" and not (m == "spice" and shared.spice_unavailable)]
    if "spice" in text and shared.spice_unavailable:
        out.values["spice"] = None
        out.per_row["spice"] = np.full(len(captions), np.nan)
        out.unavailable["spice"] = shared.spice_unavailable
    if others:
        for name, value in compute_text_metrics(tokenized_captions, tokenized_refs, others, tokenized=True,
                                                spice_corenlp=shared.options.spice_corenlp, ids=ids).items():
            out.values[name] = value.corpus if value.available else None
            out.per_row[name] = np.asarray(value.per_caption, dtype=np.float64)
            if not value.available:
                out.unavailable[name] = value.reason
                if name == "spice":
                    shared.spice_unavailable = value.reason
            if value.n_failed:
                out.failed[name] = tuple(value.failed)
    if "cider" in text:
        per = shared.cider(reference_key)(tokenized_captions, [list(refs) for refs in tokenized_refs])
        out.values["cider"] = float(per.mean())
        out.per_row["cider"] = per
    if any(m.startswith("bleu") for m in text):
        out.bleu = bleu_stats(tokenized_captions, tokenized_refs)


def _contrastive_scores(shared: SharedScoring, ids: Sequence[str], captions: list[str],
                        references: list[list[str]], out: RowScores) -> None:
    """CLIP-S / PAC-S / PAC-S++ (and Ref-) with the shared scorers: images from their cache, texts embedded anew."""
    from pacs.eval import benchmarks as bench

    suite = shared.suite
    if suite is None:
        return
    options = shared.options
    keep, paths = bench.resolve_images(bench.RunContext(Path("."), suite, options.images, options.image_map,
                                                        options.skip_missing_images), list(ids))
    if not keep.all():
        log.warning("contrastive metrics computed on %d of %d captions (missing images)", keep.sum(), len(keep))
    index = np.flatnonzero(keep)
    suite.clear_text_caches()  # this system's captions in fresh batches, as in a run of it alone
    scores = suite.score([captions[i] for i in index], [references[i] for i in index], [str(paths[i]) for i in index])
    for name, values in scores.items():
        out.values[name] = float(np.mean(values)) if len(values) else None
        full = np.full(len(captions), np.nan)
        full[index] = values
        out.per_row[name] = full
    out.truncated = truncation_counts(suite, [captions[i] for i in index])


def truncation_counts(suite: Any, captions: Sequence[str]) -> dict[str, int]:
    """`{metric: how many of captions were cut to the text context}` for every available contrastive metric.

    Read from each scorer's `truncated_captions` (the distinct captions it has cut so far): whether a caption is
    cut depends on its text alone, so the count of a system's captions is the same in a table as alone. A
    scorer that does not report truncation (a caller's own) is left out.
    """
    counts = {}
    for name in suite.metrics:
        if get_metric(name).kind != "contrastive" or name in suite.unavailable:
            continue
        cut = getattr(suite.scorer(name), "truncated_captions", None)
        if cut is not None:
            counts[name] = sum(caption in cut for caption in captions)
    return counts


def _fluency_scores(shared: SharedScoring, captions: list[str], out: RowScores) -> None:
    """Rep-n, %Incorrect, grammar-error rate and length (table values and per-caption values)."""
    from pacs.eval import fluency
    from pacs.eval.grammar import grammar_error_rate

    for name in shared.metrics:
        if name.startswith("rep"):
            n = int(name[3:])
            out.values[name] = fluency.rep_n(captions, n)
            out.per_row[name] = np.array([fluency.repetitions(c, n) for c in captions], dtype=np.float64)
        elif name == "incorrect":
            out.values[name] = fluency.incorrect_rate(captions)
            out.per_row[name] = 100.0 * np.array([fluency.ends_incorrectly(c) for c in captions], dtype=np.float64)
        elif name == "grammar":
            try:
                result = grammar_error_rate(captions, shared.grammar_checker())
            except InputError:
                raise
            except PacsError as error:
                out.values[name] = None
                out.unavailable[name] = str(error)
                continue
            out.values[name], out.grammar_backend = result.rate, result.backend
            out.per_row[name] = 100.0 * np.array([bool(e) for e in result.errors], dtype=np.float64)
        elif name == "length":
            out.values[name] = float(np.mean([len(c.split()) for c in captions]))
            out.per_row[name] = np.array([len(c.split()) for c in captions], dtype=np.float64)


def score_rows(shared: SharedScoring, ids: Sequence[str], captions: Sequence[str],
               references: Sequence[Sequence[str]], reference_key: str = "references") -> RowScores:
    """Every requested metric of caption i (image `ids[i]`) against `references[i]`.

    `reference_key` names the reference configuration (rows scored against the same references in the same
    order share one CIDEr-D scorer, whose prepared statistics are then reused).
    """
    captions, references = list(captions), [list(r) for r in references]
    out = RowScores(values={}, n_rows=len(captions), n_empty=sum(not c.strip() for c in captions))
    if out.n_empty:
        log.warning("%d empty candidate caption(s) are scored as empty strings", out.n_empty)
    _text_scores(shared, captions, references, reference_key, out, ids)
    _contrastive_scores(shared, ids, captions, references, out)
    _fluency_scores(shared, captions, out)
    out.values = {name: out.values.get(name) for name in shared.metrics}
    return out
