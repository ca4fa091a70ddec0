"""`correlate(benchmark, data, metrics, **options)`: the table `pacs correlate BENCHMARK --json` writes.

One implementation for the CLI and the library: `run_correlation(args)` runs a benchmark from the parsed
`pacs correlate` options and builds the JSON table; `pacs correlate` prints it (and writes it with `--json`),
`correlate` returns it. Options not given take the CLI's defaults (they come from the same parser).
"""
from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from metric.common.errors import InputError

#: where `data=None` points, under $PACS_SHARED, for the benchmarks whose data the shared folder holds
SHARED_DATA = {
    "flickr8k-expert": "data/flickr8k",
    "flickr8k-cf": "data/flickr8k",
    "robustness": "data/flickr8k",
    "pascal50s": "data/pascal50s",
    "nocaps-foil": "data/hallucination",
    "hat": "data/hallucination/hat-trainval.json",
}


@dataclass
class CorrelationRun:
    """One benchmark run: the benchmark, its `{metric: row}` results, its counts and the JSON table."""

    benchmark: Any
    results: dict[str, Any]
    notes: dict[str, Any] = field(default_factory=dict)
    table: dict[str, Any] = field(default_factory=dict)


def run_correlation(args: argparse.Namespace) -> CorrelationRun:
    """Run the benchmark named by parsed `pacs correlate` options; the table is what `--json` writes."""
    from eval import benchmarks as bench
    from eval.commands.correlate import _image_map, _images_dir, _json_safe, _scorer_factory
    from eval.registry import parse_metric_list
    from eval.scoring import MetricSuite
    from metric.common.provenance import provenance
    from metric.common.seeding import seed_everything

    seed_everything(args.seed)
    benchmark = bench.get_benchmark(args.benchmark)
    metrics = parse_metric_list(args.metrics)
    if args.bootstrap < 0:
        raise InputError(f"--bootstrap must be >= 0, got {args.bootstrap}")
    data = Path(args.data)
    if not data.exists():
        raise InputError(f"--data {data} does not exist")
    models: dict[str, Any] = {}
    suite = MetricSuite(metrics, _scorer_factory(args, models), getattr(args, "spice_corenlp", None))
    context = bench.RunContext(data=data, suite=suite, images=_images_dir(args), image_map=_image_map(args),
                               skip_missing_images=args.skip_missing_images, bootstrap=args.bootstrap,
                               seed=args.seed, args=args)
    results = benchmark.run(context)
    table = dict(results)
    table.update({
        "benchmark": benchmark.name,
        "counts": dict(context.notes),
        "provenance": provenance(seed=args.seed, w=getattr(args, "w", None), config={
            "benchmark": benchmark.name, "data": str(data), "metrics": metrics, "images": args.images,
            "bootstrap": args.bootstrap, "skip_missing_images": args.skip_missing_images,
            "checkpoint": getattr(args, "checkpoint", None), "backbone": getattr(args, "backbone", None)},
            models=models),
    })
    return CorrelationRun(benchmark, results, dict(context.notes), _json_safe(table))


def _shared_data(benchmark: str) -> str:
    """The benchmark's data in $PACS_SHARED (for `data=None`); InputError where the shared folder has none."""
    from metric.common.paths import shared_dir

    key = str(benchmark).strip().lower()
    if key not in SHARED_DATA:
        raise InputError(f"pass data= for {benchmark!r}: the shared folder holds data for "
                         f"{', '.join(sorted(SHARED_DATA))} only")
    return str(shared_dir() / SHARED_DATA[key])


def correlation_options(benchmark: str, data: str | os.PathLike, metrics: str | Sequence[str],
                        **options: Any) -> argparse.Namespace:
    """The parsed `pacs correlate` options: the CLI's defaults, overridden by `options` (Python names).

    An option the command does not have is an InputError listing the known ones.
    """
    from eval.commands.correlate import register

    parser = argparse.ArgumentParser(prog="pacs", add_help=False)
    register(parser.add_subparsers(dest="command"))
    names = ",".join(metrics) if not isinstance(metrics, str) else metrics
    args = parser.parse_args(["correlate", str(benchmark), "--data", os.fspath(data), "--metrics", names])
    known = sorted(set(vars(args)) - {"command", "func", "benchmark", "data", "metrics"})
    for key, value in options.items():
        if key not in known:
            raise InputError(f"unknown correlate option {key!r} (known: {', '.join(known)})")
        setattr(args, key, os.fspath(value) if isinstance(value, os.PathLike) else value)
    return args


def correlate(benchmark: str, data: str | os.PathLike | None = None, metrics: str | Sequence[str] | None = None,
              **options: Any) -> dict[str, Any]:
    """Correlate metrics with human judgments: the table `pacs correlate BENCHMARK --json FILE` writes.

    `benchmark` is a `pacs correlate` benchmark (flickr8k-expert, flickr8k-cf, composite, pascal50s, foil,
    nocaps-foil, hat, robustness, vatex-eval, activitynet-foil); `data` its data folder or file (None: the
    copy under $PACS_SHARED, where there is one); `metrics` a list or comma-separated string of metric names.
    `options` are the command's other options with Python names and the CLI's defaults: `images`,
    `image_map`, `skip_missing_images`, `bootstrap`, `seed`, `spice_corenlp`, the model options
    (`checkpoint`, `backbone`, `arch`, `family`, `allow_family_mismatch`, `w`, `device`, `batch_size`,
    `cache_dir`, `lora_mode`, ...) and the benchmark's own (`num_refs`, `draws`, `num_images`, ...).
    The table maps each metric to its row (e.g. `tau_b`, `tau_c`, `n`), plus `benchmark`, `counts` and
    `provenance`.

    >>> from eval import correlate
    >>> table = correlate("hat", metrics="cider,length")  # HAT from $PACS_SHARED: AUROC per metric
    >>> table["benchmark"], sorted(table["cider"]), table["cider"]["n"]
    ('hat', ['auroc', 'n'], 400)
    >>> round(table["cider"]["auroc"], 3), round(table["length"]["auroc"], 3)
    (0.666, 0.493)
    """
    if metrics is None:
        raise InputError("pass metrics= (e.g. 'bleu4,cider' or ['clip-s', 'cider'])")
    if data is None:
        data = _shared_data(benchmark)
    return run_correlation(correlation_options(benchmark, data, metrics, **options)).table
