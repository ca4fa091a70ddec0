"""`pacs correlate` (human-correlation benchmarks); `pacs evaluate` lives in `pacs.eval.commands.evaluate`."""
from __future__ import annotations

import argparse
import logging
import math
from pathlib import Path
from typing import Any

from pacs.eval import benchmarks as bench
from pacs.eval.commands.options import add_dataclass_options, dataclass_from_args
from pacs.eval.correlate_run import CorrelationRequest, image_map_table, images_folder, run_correlation, scorer_factory
from pacs.metric.commands.output_flag import add_out_option
from pacs.metric.common.errors import InputError
from pacs.metric.common.io import write_json_atomic
from pacs.metric.common.output_paths import Folder, check_outputs, model_inputs, path_inputs
from pacs.metric.common.terminal import escape_control
from pacs.metric.scoring.model_options import ModelOptions

log = logging.getLogger(__name__)



def _model_options(args: argparse.Namespace) -> ModelOptions:
    """The model options of the parsed flags."""
    return ModelOptions.from_mapping(args)


def _scorer_factory(args: argparse.Namespace, models: dict[str, Any] | None = None):
    """A factory building a contrastive Scorer from the model flags (`pacs.eval.correlate_run.scorer_factory`)."""
    return scorer_factory(_model_options(args), models)


def _image_map(args: argparse.Namespace) -> dict[str, str] | None:
    """The `--image-map` file, when given."""
    return image_map_table(getattr(args, "image_map", None))


def _images_dir(args: argparse.Namespace) -> Path | None:
    """The `--images` folder (checked)."""
    return images_folder(getattr(args, "images", None))


def correlation_request(args: argparse.Namespace) -> CorrelationRequest:
    """The typed request of parsed `pacs correlate` flags (the benchmark's options dataclass from its flags)."""
    benchmark = bench.get_benchmark(args.benchmark)
    options = dataclass_from_args(benchmark.options_class, args) if benchmark.options_class else None
    return CorrelationRequest(
        benchmark=args.benchmark, data=Path(args.data), metrics=[args.metrics], images=args.images,
        image_map=args.image_map, skip_missing_images=args.skip_missing_images, bootstrap=args.bootstrap,
        seed=args.seed, spice_corenlp=args.spice_corenlp, model=_model_options(args), options=options)


def _format(value: Any) -> str:
    """A table cell."""
    if isinstance(value, float):
        return f"{value:.3f}" if math.isfinite(value) else "nan"
    if value is None:
        return "-"
    return str(value)


def print_table(results: dict[str, Any]) -> None:
    """Print `{metric: {column: value}}` as an aligned text table on stdout."""
    columns: list[str] = []
    for row in results.values():
        for key, value in row.items():
            if key not in columns and not isinstance(value, (list, dict)) and key not in ("best", "unavailable"):
                columns.append(key)
    width = max([len("metric")] + [len(name) for name in results]) + 2
    sizes = [max(10, len(c) + 2) for c in columns]
    print("metric".ljust(width) + "".join(c.rjust(size) for c, size in zip(columns, sizes)))
    for name, row in results.items():
        cells = "".join(_format(row.get(c)).rjust(size) for c, size in zip(columns, sizes))
        note = f"  (unavailable: {row['unavailable'][:60]}...)" if row.get("unavailable") else ""
        print(escape_control(name.ljust(width) + cells + note))  # metric names may be the user's


def check_correlate_outputs(args: argparse.Namespace) -> None:
    """Refuse (InputError, before any work) an `--out` that is an input of `pacs correlate`: the `--data` file or a
    file of its folder, the `--image-map`, an image of `--images`, a model file or folder."""
    from pacs.metric.scoring.image_lookup import IMAGE_SUFFIXES

    data_files, data_folders = path_inputs("--data", args.data)
    model_files, model_folders = model_inputs(args)
    check_outputs([("--out", args.json)], [*data_files, ("--image-map", args.image_map), *model_files],
                  [*data_folders, Folder("--images", args.images, IMAGE_SUFFIXES), *model_folders,
                   *path_inputs("--spice-corenlp", args.spice_corenlp)[1]])


def run_correlate(args: argparse.Namespace) -> int:
    """`pacs correlate`: run a benchmark for every metric and print (and optionally save) the table."""
    check_correlate_outputs(args)
    run = run_correlation(correlation_request(args))  # the library's implementation (pacs.eval.correlate's table)
    print(f"{run.benchmark.name}: {run.benchmark.description}")
    print_table(run.results)
    for key, value in run.notes.items():
        print(f"{key}: {value}")
    if args.json:
        write_json_atomic(args.json, run.table)
        print(escape_control(f"-> {args.json}"))
    return 0


def add_common_options(parser: argparse.ArgumentParser) -> None:
    """Options shared by correlate and evaluate (images, --out, --seed, SPICE, the model options)."""
    parser.add_argument("--images", metavar="DIR", help="image folder (DIR/<image_id>[.jpg|.jpeg|.png])")
    parser.add_argument("--image-map", metavar="FILE", help='{"image_id": "path"} (overrides --images)')
    parser.add_argument("--skip-missing-images", action="store_true",
                        help="skip items whose image is missing (for every metric) instead of failing")
    # `--out`, as every command; the parsed name stays `json` (the 0.5 flag, still accepted with a notice)
    add_out_option(parser, "write the result table as JSON (atomically)", dest="json", deprecated=("--json",))
    parser.add_argument("--seed", type=int, default=0, help="seed for sampling and bootstrap")
    parser.add_argument("--spice-corenlp", metavar="DIR",
                        help="folder with stanford-corenlp-3.6.0.jar and -models.jar for SPICE "
                             "(or $PACS_SPICE_CORENLP)")
    from pacs.metric.commands.score import add_model_options

    add_model_options(parser)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add this package's sub-commands to the `pacs` parser."""
    correlate = subparsers.add_parser(
        "correlate", help="correlate metrics with human judgments on a benchmark",
        description="Run a human-judgment benchmark for any registered metric.")
    correlate.add_argument("benchmark", help=f"one of: {' '.join(bench.benchmark_names())}")
    correlate.add_argument("--data", required=True, metavar="DIR|FILE", help="the benchmark's data folder or file")
    from pacs.eval.registry import METRICS

    correlate.add_argument("--metrics", required=True,
                           help="comma-separated metric names, any of: "
                                + ",".join(name for name, metric in METRICS.items() if metric.per_caption)
                                + " (length = caption length in words, the baseline; e.g. bleu4,cider,clip-s,length)")
    correlate.add_argument("--bootstrap", type=int, default=0, metavar="N",
                           help="N bootstrap resamples: 95%% intervals and paired p-values against the best metric")
    add_common_options(correlate)
    group = correlate.add_argument_group("benchmark options")
    for name in bench.benchmark_names():
        try:
            benchmark = bench.get_benchmark(name)
        except (InputError, ImportError):
            continue
        if benchmark.options_class is not None:  # the flags come from the options dataclass (one source)
            add_dataclass_options(group, benchmark.options_class)
    correlate.set_defaults(func=run_correlate)


