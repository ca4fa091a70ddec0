"""Human-judgment benchmarks: one module each, one registry.

Registering a benchmark (e.g. from `eval/benchmarks/vatex_eval.py`)::

    from pacs.eval.benchmarks import Benchmark, RunContext, register_benchmark

    @register_benchmark("vatex-eval")
    class VatexEval(Benchmark):
        description = "VATEX-EVAL: Kendall tau-b and Spearman rho, 0/1/9 references"

        options_class = VatexEvalOptions          # optional: a dataclass of the benchmark's own options

        def run(self, context: RunContext) -> dict:  # {metric: {...}} as docs/data_layouts.md lists the keys
            options = self.options_of(context)       # context.options, else the dataclass defaults
            ...

The options dataclass is the one source of truth for the benchmark's options: its fields (type hints,
defaults, a one-line `metadata["help"]`) become `pacs correlate` flags (`pacs.eval.commands.correlate`) and the
keyword arguments of `pacs.eval.correlate(benchmark, ..., **options)`.

Built-in modules are imported lazily by `get_benchmark` (see `_MODULES`); a module added later only needs
an entry there (or to be imported before use). `RunContext` carries the data path, the metric names, a
`MetricSuite` (per-caption scoring of any registered metric), the images, the missing-image rule, the
bootstrap count, the seed, the model options and the benchmark's options; `resolve_images` applies the
missing-image rule and `kendall_table` / `accuracy_table` / `auroc_table` produce the standard outputs.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pacs.eval import correlation, intervals
from pacs.eval.caption_scoring import MetricSuite
from pacs.metric.common.errors import InputError
from pacs.metric.scoring.image_lookup import ImageFinder
from pacs.metric.scoring.image_lookup import find_image as _find_image
from pacs.metric.scoring.model_options import ModelOptions

log = logging.getLogger(__name__)

#: benchmark name -> module that registers it (imported on first use)
_MODULES = {
    "flickr8k-expert": "pacs.eval.benchmarks.flickr8k",
    "flickr8k-cf": "pacs.eval.benchmarks.flickr8k",
    "composite": "pacs.eval.benchmarks.composite",
    "pascal50s": "pacs.eval.benchmarks.pascal50s",
    "foil": "pacs.eval.benchmarks.foil",
    "nocaps-foil": "pacs.eval.benchmarks.hallucination",
    "hat": "pacs.eval.benchmarks.hallucination",
    "robustness": "pacs.eval.benchmarks.robustness",
    "vatex-eval": "pacs.eval.benchmarks.vatex_eval",
    "activitynet-foil": "pacs.eval.benchmarks.activitynet_foil",
}

BENCHMARKS: dict[str, type[Benchmark]] = {}


class Benchmark:
    """A human-judgment benchmark: loads its data from `context.data` and returns `{metric: results}`."""

    name: str = ""
    description: str = ""
    #: a dataclass of the benchmark's own options (None: it has none)
    options_class: type | None = None

    def option_names(self) -> list[str]:
        """The names of the benchmark's own options (the fields of `options_class`)."""
        return [f.name for f in dataclasses.fields(self.options_class)] if self.options_class else []

    def make_options(self, **values: Any) -> Any:
        """The benchmark's options from keyword arguments; an unknown one is an InputError listing the known."""
        known = self.option_names()
        for key in values:
            if key not in known:
                raise InputError(f"unknown option {key!r} of benchmark {self.name!r} "
                                 f"(known: {', '.join(known) or 'none'})", parameter=key)
        return self.options_class(**values) if self.options_class else None

    def options_of(self, context: RunContext) -> Any:
        """The context's options for this benchmark, else the defaults of `options_class`."""
        if context.options is not None:
            return context.options
        return self.options_class() if self.options_class else None

    def run(self, context: RunContext) -> dict[str, Any]:
        """Compute the benchmark's table for every metric of `context`."""
        raise NotImplementedError


def register_benchmark(name: str) -> Callable[[type[Benchmark]], type[Benchmark]]:
    """Class decorator adding a Benchmark subclass to BENCHMARKS under `name`."""
    def decorator(cls: type[Benchmark]) -> type[Benchmark]:
        key = name.lower()
        if key in BENCHMARKS and BENCHMARKS[key] is not cls:
            raise ValueError(f"benchmark {name!r} is registered twice")
        cls.name = key
        BENCHMARKS[key] = cls
        return cls
    return decorator


def benchmark_names() -> list[str]:
    """Every benchmark name pacs knows (registered or lazily importable)."""
    return sorted(set(_MODULES) | set(BENCHMARKS))


def get_benchmark(name: str) -> Benchmark:
    """An instance of the benchmark `name` (case-insensitive); InputError for an unknown or missing one."""
    key = str(name).strip().lower()
    if key not in BENCHMARKS and key in _MODULES:
        try:
            importlib.import_module(_MODULES[key])
        except ModuleNotFoundError as error:
            if error.name != _MODULES[key]:
                raise
    if key not in BENCHMARKS:
        known = ", ".join(name for name in benchmark_names() if name in BENCHMARKS or _importable(name))
        raise InputError(f"unknown benchmark {name!r} (known: {known})")
    return BENCHMARKS[key]()


def _importable(name: str) -> bool:
    """True when the module of a lazily registered benchmark exists."""
    return importlib.util.find_spec(_MODULES[name]) is not None if name in _MODULES else False


@dataclass
class RunContext:
    """Everything a benchmark needs to run: data, metrics, images, model options and its own options."""

    data: Path
    suite: MetricSuite
    images: Path | None = None
    image_map: dict[str, str] | None = None
    skip_missing_images: bool = False
    bootstrap: int = 0
    seed: int = 0
    #: the benchmark's options (an instance of its `options_class`; None: the defaults)
    options: Any = None
    #: the model options the contrastive metrics are built from (video benchmarks build their scorers)
    model: ModelOptions = field(default_factory=ModelOptions)
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def metrics(self) -> list[str]:
        """Canonical metric names, in the order given."""
        return list(self.suite.metrics)

    def count(self, key: str, amount: int = 1) -> None:
        """Add to a counter reported with the results (skips, NaNs, empty captions...)."""
        self.notes[key] = self.notes.get(key, 0) + amount


def find_image(image_id: str, images: Path | None, image_map: dict[str, str] | None = None,
               relative_path: str | None = None) -> Path | None:
    """Path of an image (`pacs.metric.scoring.image_lookup.find_image`: `image_map`, then DIR/<relative path>, DIR/<id>,
    DIR/<id>.{jpg,jpeg,png} in any case); None when there is none."""
    return _find_image(image_id, images, image_map, relative_path)


def resolve_images(context: RunContext, image_ids: Sequence[str],
                   relative_paths: Sequence[str | None] | None = None) -> tuple[np.ndarray, list[Path | None]]:
    """Locate the image of every item when a metric needs images.

    Returns a keep-mask and the paths. A missing image is an InputError naming it, unless
    `skip_missing_images`: then the item is dropped for every metric and counted.
    """
    keep = np.ones(len(image_ids), dtype=bool)
    if not context.suite.needs_images:
        return keep, [None] * len(image_ids)
    if context.images is None and not context.image_map:
        raise InputError("contrastive metrics need images: pass images= (or image_map=)",
                         parameter=("images", "image_map"))
    paths: list[Path | None] = []
    cache: dict[tuple[str, str | None], Path | None] = {}
    finder = ImageFinder(context.images, context.image_map)  # the lookup of every command (pacs.metric.scoring.image_lookup)
    for index, image_id in enumerate(image_ids):
        relative = relative_paths[index] if relative_paths else None
        key = (image_id, relative)
        if key not in cache:
            cache[key] = finder.find(image_id, relative)
        path = cache[key]
        if path is None:
            if not context.skip_missing_images:
                raise InputError(f"image {image_id!r} not found under {context.images} "
                                 "(pass skip_missing_images= to skip its pairs for every metric)",
                                 parameter="skip_missing_images")
            keep[index] = False
        paths.append(path)
    skipped = int((~keep).sum())
    if skipped:
        context.count("skipped_missing_image", skipped)
        log.warning("skipped %d item(s) whose image is missing (for every metric)", skipped)
    return keep, paths


def score_unique(context: RunContext, candidates: Sequence[str], references: Sequence[Sequence[str]],
                 images: Sequence[Any] | None) -> dict[str, np.ndarray]:
    """Score items, each distinct (image, candidate, references) once, results expanded to every item.

    Empty candidates are scored like any other caption and counted (`empty_candidates`).
    """
    empty = sum(not str(c).strip() for c in candidates)
    if empty:
        context.count("empty_candidates", empty)
        log.warning("%d empty candidate caption(s) are scored (as empty strings)", empty)
    keys = [(str(img), c, tuple(r)) for img, c, r in zip(images or [None] * len(candidates), candidates, references)]
    distinct = list(dict.fromkeys(keys))
    where = {key: i for i, key in enumerate(distinct)}
    inverse = np.fromiter((where[k] for k in keys), dtype=np.int64, count=len(keys))
    first = {}
    for i, key in enumerate(keys):
        first.setdefault(key, i)
    order = [first[key] for key in distinct]
    scores = context.suite.score([candidates[i] for i in order], [list(references[i]) for i in order],
                                 [images[i] for i in order] if images is not None else None)
    note_truncation(context)
    return {name: values[inverse] for name, values in scores.items()}


def note_truncation(context: RunContext) -> None:
    """Report, per contrastive metric, how many distinct candidates were cut to the text context so far
    (`truncated_captions[METRIC]` in the counts; with `long_captions="chunk"`, those with a sentence too long)."""
    from pacs.eval.registry import get_metric

    for name in context.metrics:
        if get_metric(name).kind != "contrastive" or name in context.suite.unavailable:
            continue
        truncated = getattr(context.suite.scorer(name), "truncated_captions", None)
        if truncated:
            context.notes[f"truncated_captions[{name}]"] = len(truncated)


def kendall_table(context: RunContext, scores: dict[str, np.ndarray], human: np.ndarray) -> dict[str, Any]:
    """`{metric: {"tau_b", "tau_c", "n"}}` (×100), with bootstrap intervals and paired p-values on request."""
    table: dict[str, Any] = {}
    for name, values in scores.items():
        if name in context.suite.unavailable:
            table[name] = {"tau_b": None, "tau_c": None, "n": 0, "unavailable": context.suite.unavailable[name]}
            continue
        table[name] = {"tau_b": correlation.kendall(values, human, "b"),
                       "tau_c": correlation.kendall(values, human, "c"), "n": len(human)}
    available = [name for name in scores if name not in context.suite.unavailable]
    if context.bootstrap and available:
        def statistic(indices: np.ndarray) -> dict[str, float]:
            out = {}
            for name in available:
                out[f"{name}/b"] = correlation.kendall(scores[name][indices], human[indices], "b")
                out[f"{name}/c"] = correlation.kendall(scores[name][indices], human[indices], "c")
            return out
        samples = intervals.bootstrap(statistic, len(human), context.bootstrap, context.seed)
        best = max(available, key=lambda name: table[name]["tau_b"])
        for name in available:
            table[name]["tau_b_ci"] = intervals.confidence_interval(samples[f"{name}/b"])
            table[name]["tau_c_ci"] = intervals.confidence_interval(samples[f"{name}/c"])
            table[name]["p_value_vs_best"] = (None if name == best else
                                              intervals.paired_p_value(samples[f"{best}/b"], samples[f"{name}/b"]))
            table[name]["best"] = best
    return table


def accuracy_table(context: RunContext, score_a: dict[str, np.ndarray], score_b: dict[str, np.ndarray],
                   a_preferred: np.ndarray, categories: np.ndarray, category_order: Sequence[str],
                   mean_of_categories: bool = True) -> dict[str, Any]:
    """`{metric: {category: accuracy, ..., "mean": ...}}` (×100; a metric tie counts half).

    `mean` is the mean of the category accuracies (Pascal-50S convention) or, with
    `mean_of_categories=False`, the accuracy over all items.
    """
    table: dict[str, Any] = {}
    for name, values_a in score_a.items():
        if name in context.suite.unavailable:
            table[name] = {"unavailable": context.suite.unavailable[name]}
            continue
        row: dict[str, Any] = {}
        for category in category_order:
            mask = categories == category
            if mask.any():
                row[category] = correlation.pairwise_accuracy(values_a[mask], score_b[name][mask], a_preferred[mask])
        if mean_of_categories:
            row["mean"] = float(np.mean([row[c] for c in category_order if c in row])) if row else float("nan")
        else:
            row["mean"] = correlation.pairwise_accuracy(values_a, score_b[name], a_preferred)
        row["n"] = len(a_preferred)
        table[name] = row
    if context.bootstrap:
        available = [name for name in score_a if name not in context.suite.unavailable]

        def statistic(indices: np.ndarray) -> dict[str, float]:
            return {name: correlation.pairwise_accuracy(score_a[name][indices], score_b[name][indices],
                                                        a_preferred[indices]) for name in available}
        samples = intervals.bootstrap(statistic, len(a_preferred), context.bootstrap, context.seed)
        best = max(available, key=lambda name: table[name]["mean"]) if available else None
        for name in available:
            table[name]["mean_ci"] = intervals.confidence_interval(samples[name])
            table[name]["p_value_vs_best"] = (None if name == best else
                                              intervals.paired_p_value(samples[best], samples[name]))
    return table


def auroc_table(context: RunContext, scores: dict[str, np.ndarray], positive: np.ndarray) -> dict[str, Any]:
    """`{metric: {"auroc", "n"}}` (higher score = positive class), with bootstrap intervals on request."""
    table: dict[str, Any] = {}
    for name, values in scores.items():
        if name in context.suite.unavailable:
            table[name] = {"auroc": None, "n": 0, "unavailable": context.suite.unavailable[name]}
            continue
        table[name] = {"auroc": correlation.auroc(values, positive), "n": len(positive)}
    if context.bootstrap:
        available = [name for name in scores if name not in context.suite.unavailable]
        samples = intervals.bootstrap(
            lambda idx: {name: correlation.auroc(scores[name][idx], positive[idx]) for name in available},
            len(positive), context.bootstrap, context.seed)
        for name in available:
            table[name]["auroc_ci"] = intervals.confidence_interval(samples[name])
    return table
