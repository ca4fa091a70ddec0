"""`correlate(benchmark, data, metrics, **options)`: the table `pacs correlate BENCHMARK --out` writes.

One implementation for the CLI and the library: `run_correlation(request)` runs a benchmark from a typed
`CorrelationRequest` (common options, `ModelOptions`, the benchmark's own options dataclass) and builds the
JSON table; `pacs correlate` builds the request from its flags (`pacs.eval.commands.correlate`), prints the table
and writes it with `--out`; `correlate` builds it from keyword arguments and returns the table.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pacs.metric.common.errors import InputError
from pacs.metric.common.io import nonfinite_to_none
from pacs.metric.common.suggest import known_hint
from pacs.metric.scoring.model_options import ModelOptions, scoring_conventions

#: where `data=None` points, under $PACS_SHARED, for the benchmarks whose data the shared folder holds
SHARED_DATA = {
    "flickr8k-expert": "data/flickr8k",
    "flickr8k-cf": "data/flickr8k",
    "robustness": "data/flickr8k",
    "pascal50s": "data/pascal50s",
    "nocaps-foil": "data/hallucination",
    "hat": "data/hallucination/hat-trainval.json",
}

#: the options of every benchmark run besides the model's and the benchmark's own
COMMON_OPTIONS = ("images", "image_map", "skip_missing_images", "bootstrap", "seed", "spice_corenlp")


@dataclass
class CorrelationRequest:
    """One benchmark run to do: the benchmark, its data, the metrics and every option, typed."""

    benchmark: str
    data: Path
    metrics: list[str]
    images: str | None = None
    image_map: str | None = None
    skip_missing_images: bool = False
    bootstrap: int = 0
    seed: int = 0
    spice_corenlp: str | None = None
    model: ModelOptions = field(default_factory=ModelOptions)
    #: the benchmark's options (an instance of its `options_class`; None: its defaults)
    options: Any = None


@dataclass
class CorrelationRun:
    """One benchmark run: the benchmark, its `{metric: row}` results, its counts and the JSON table."""

    benchmark: Any
    results: dict[str, Any]
    notes: dict[str, Any] = field(default_factory=dict)
    table: dict[str, Any] = field(default_factory=dict)


def images_folder(images: str | os.PathLike | None) -> Path | None:
    """The image folder (checked); None when not given."""
    if not images:
        return None
    folder = Path(images)
    if not folder.is_dir():
        raise InputError(f"images= folder not found: {folder}", parameter="images")
    return folder


def image_map_table(image_map: str | os.PathLike | None) -> dict[str, str] | None:
    """The `{image_id: path}` table of an image-map file, when given."""
    if not image_map:
        return None
    from pacs.metric.scoring.score_inputs import load_image_map

    return {key: str(path) for key, path in load_image_map(image_map).items()}


def scorer_factory(model: ModelOptions, models: dict[str, Any] | None = None) -> Callable[[str], Any]:
    """A factory building a contrastive Scorer per metric from the model options; records each model's
    identity (family and how it was established) in `models`, by metric, for the provenance."""
    def factory(metric: str) -> Any:
        from pacs.metric.scoring.model_options import build_scorer, model_identity

        scorer = build_scorer(metric, model)
        if models is not None:
            models[metric] = model_identity(scorer.backbone)
        return scorer
    return factory


def run_correlation(request: CorrelationRequest) -> CorrelationRun:
    """Run the benchmark of `request`; the table is what `pacs correlate --out` writes."""
    from pacs.eval import benchmarks as bench
    from pacs.eval.caption_scoring import MetricSuite
    from pacs.eval.registry import parse_metric_list
    from pacs.metric.common.provenance import provenance
    from pacs.metric.common.seeding import seed_everything

    seed_everything(request.seed)
    benchmark = bench.get_benchmark(request.benchmark)
    metrics = parse_metric_list(",".join(request.metrics))
    if request.bootstrap < 0:
        raise InputError(f"bootstrap= must be >= 0, got {request.bootstrap}", parameter="bootstrap")
    data = Path(request.data)
    if not data.exists():
        raise InputError(f"data= {data} does not exist", parameter="data")
    models: dict[str, Any] = {}
    model = request.model
    conventions = scoring_conventions(model)  # a bad score= / long_captions= fails before any work
    suite = MetricSuite(metrics, scorer_factory(model, models), request.spice_corenlp)
    context = bench.RunContext(data=data, suite=suite, images=images_folder(request.images),
                               image_map=image_map_table(request.image_map),
                               skip_missing_images=request.skip_missing_images, bootstrap=request.bootstrap,
                               seed=request.seed, options=request.options, model=model)
    results = benchmark.run(context)
    table = dict(results)
    table.update({
        "benchmark": benchmark.name,
        "counts": dict(context.notes),
        "provenance": provenance(seed=request.seed, w=model.w, config={
            "benchmark": benchmark.name, "data": str(data.resolve()), "metrics": metrics, "images": request.images,
            "bootstrap": request.bootstrap, "skip_missing_images": request.skip_missing_images,
            "checkpoint": model.checkpoint, "backbone": model.backbone, **conventions},
            models=models),
    })
    return CorrelationRun(benchmark, results, dict(context.notes), nonfinite_to_none(table))


def _shared_data(benchmark: str) -> str:
    """The benchmark's data in $PACS_SHARED (for `data=None`); InputError where the shared folder has none."""
    from pacs.metric.common.shared_data import shared_dir

    key = str(benchmark).strip().lower()
    if key not in SHARED_DATA:
        raise InputError(f"pass data= for {benchmark!r}: the shared folder holds data for "
                         f"{', '.join(sorted(SHARED_DATA))} only", parameter="data")
    return str(shared_dir() / SHARED_DATA[key])


def correlation_options(benchmark: str, data: str | os.PathLike, metrics: str | Sequence[str],
                        **options: Any) -> CorrelationRequest:
    """The request of a run: the defaults, overridden by `options` (common, model and benchmark options).

    An option neither common, nor a model option, nor one of the benchmark's own is an InputError listing
    the known ones.
    """
    from pacs.eval.benchmarks import get_benchmark

    bench = get_benchmark(benchmark)
    model_fields = [f.name for f in dataclasses.fields(ModelOptions)]
    own = bench.option_names()
    known = sorted(set(COMMON_OPTIONS) | set(model_fields) | set(own))
    values = {key: os.fspath(value) if isinstance(value, os.PathLike) else value for key, value in options.items()}
    for key in values:
        if key not in known:
            raise InputError(f"unknown correlate option {key!r} {known_hint(key, known)}", parameter=key)
    names = [metrics] if isinstance(metrics, str) else list(metrics)
    return CorrelationRequest(
        benchmark=str(benchmark), data=Path(os.fspath(data)), metrics=names,
        model=ModelOptions(**{k: v for k, v in values.items() if k in model_fields}),
        options=bench.make_options(**{k: v for k, v in values.items() if k in own}),
        **{k: v for k, v in values.items() if k in COMMON_OPTIONS})


def correlate(benchmark: str, data: str | os.PathLike | None = None, metrics: str | Sequence[str] | None = None,
              **options: Any) -> dict[str, Any]:
    """Correlate metrics with human judgments: the table `pacs correlate BENCHMARK --out FILE` writes.

    `benchmark` is a `pacs correlate` benchmark (flickr8k-expert, flickr8k-cf, composite, pascal50s, foil,
    nocaps-foil, hat, robustness, vatex-eval, activitynet-foil); `data` its data folder or file (None: the
    copy under $PACS_SHARED, where there is one); `metrics` a list or comma-separated string of metric names.
    `options` are the command's other options with Python names and the CLI's defaults: `images`,
    `image_map`, `skip_missing_images`, `bootstrap`, `seed`, `spice_corenlp`, the model options
    (`ModelOptions`: `checkpoint`, `backbone`, `arch`, `family`, `allow_family_mismatch`, `w`, `device`,
    `batch_size`, `cache_dir`, `lora_mode`, `dtype`, `score`, `long_captions`) and the benchmark's own (the fields of its
    `options_class`: `num_refs`, `draws`, `num_images`, `videos`, ...).
    The table maps each metric to its row (e.g. `tau_b`, `tau_c`, `n`), plus `benchmark`, `counts` (skips,
    exclusions and `truncated_captions[METRIC]`: distinct candidates cut to a contrastive model's text context,
    present when not 0) and `provenance` (its `config` records `score` and `long_captions`; its `models` each
    contrastive metric's backbone and family).

    >>> from pacs.eval import correlate
    >>> table = correlate("hat", metrics="cider,length")  # HAT from $PACS_SHARED: AUROC per metric
    >>> table["benchmark"], sorted(table["cider"]), table["cider"]["n"]
    ('hat', ['auroc', 'n'], 400)
    >>> round(table["cider"]["auroc"], 3), round(table["length"]["auroc"], 3)
    (0.666, 0.493)
    """
    if metrics is None:
        raise InputError("pass metrics= (e.g. 'bleu4,cider' or ['clip-s', 'cider'])", parameter="metrics")
    if data is None:
        data = _shared_data(benchmark)
    return run_correlation(correlation_options(benchmark, data, metrics, **options)).table


def evaluate_systems(candidates: Sequence[str] | Mapping[str, Any], references: str | os.PathLike | Mapping[str, Any],
                     metrics: str | Sequence[str], **options: Any) -> dict[str, Any]:
    """A system-level table: the JSON `pacs evaluate --candidates NAME=FILE ... --out` writes.

    `candidates` are `NAME=FILE` strings (or plain files, named after their stems), or a mapping
    `{name: captions}` with captions in memory (`{image_id: caption}` or `[{"image_id", "caption"}]`) or a file;
    `references` a file or `{image_id: [reference, ...]}` in memory. `options` are the command's other options
    with Python names: `human_baseline`, `equal_refs`, `skip_single_reference_images`, `baseline`, `bootstrap`,
    `recompute_corpus`, `seed`, `metric_models` (`--metric-model`: `["pac-s=FILE", ...]` or `{metric: SPEC}`, a
    model per contrastive column), the scoring options (`images`, `image_map`, `skip_missing_images`,
    `spice_corenlp`, `grammar_backend`, ...) and the model options (`ModelOptions`). Unknown ones: InputError.
    `pacs.eval.table_export.table_latex` / `table_markdown` render the table as the papers' tables.

    >>> from pacs.eval import evaluate_systems
    >>> refs = {"1": ["a dog runs on the grass", "a brown dog"], "2": ["a cat sleeps", "a cat on a bed"]}
    >>> table = evaluate_systems({"A": {"1": "a dog runs", "2": "a cat"}, "B": {"1": "a dog", "2": "a cat on a bed"}},
    ...                          refs, "length,incorrect", bootstrap=0)
    >>> table["systems"], [row["values"]["length"] for row in table["rows"]]
    (['A', 'B'], [2.5, 3.5])
    >>> table["columns"]["incorrect"]["better"], table["rows"][1]["file"]
    ('lower', None)
    """
    from pacs.eval.registry import parse_metric_list
    from pacs.eval.system_scoring import ScoringOptions
    from pacs.eval.system_table import TableRequest, build_system_table

    names = parse_metric_list(metrics if isinstance(metrics, str) else list(metrics))
    table_fields = {"seed", "bootstrap", "human_baseline", "equal_refs", "skip_single_reference_images", "baseline",
                    "recompute_corpus", "metric_models"}
    scoring_fields = {f.name for f in dataclasses.fields(ScoringOptions)} - {"metrics"}
    model_fields = {f.name for f in dataclasses.fields(ModelOptions)}
    for key in options:
        if key not in table_fields | scoring_fields | model_fields:
            known = sorted(table_fields | scoring_fields | model_fields)
            raise InputError(f"unknown evaluate option {key!r} {known_hint(key, known)}", parameter=key)
    scoring = {k: v for k, v in options.items() if k in scoring_fields}
    scoring["images"] = images_folder(scoring.get("images"))
    scoring["image_map"] = image_map_table(scoring.get("image_map"))
    systems = dict(candidates) if isinstance(candidates, Mapping) else [os.fspath(c) for c in candidates]
    request = TableRequest(
        candidates=systems, references=references if isinstance(references, Mapping) else os.fspath(references),
        metrics=names, scoring=ScoringOptions(metrics=names, **scoring),
        model=ModelOptions(**{k: v for k, v in options.items() if k in model_fields}),
        **{k: v for k, v in options.items() if k in table_fields})
    return build_system_table(request)
