"""`pacs correlate` (human-correlation benchmarks) and `pacs evaluate` (the captioning table)."""
from __future__ import annotations

import argparse
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np

from eval import benchmarks as bench
from eval.api import CorrelationRequest, image_map_table, images_folder, json_safe, run_correlation, scorer_factory
from eval.commands.options import add_dataclass_options, dataclass_from_args
from eval.registry import get_metric, parse_metric_list
from eval.scoring import MetricSuite
from metric.common.errors import InputError, PacsError
from metric.common.io import write_json_atomic
from metric.common.provenance import provenance
from metric.common.seeding import seed_everything
from metric.scoring.model_options import ModelOptions

log = logging.getLogger(__name__)

DEFAULT_EVALUATE_METRICS = ("bleu1", "bleu2", "bleu3", "bleu4", "meteor", "rouge", "cider", "spice",
                            "rep1", "rep2", "rep3", "rep4", "incorrect", "grammar")


def _model_options(args: argparse.Namespace) -> ModelOptions:
    """The model options of the parsed flags."""
    return ModelOptions.from_mapping(args)


def _scorer_factory(args: argparse.Namespace, models: dict[str, Any] | None = None):
    """A factory building a contrastive Scorer from the model flags (`eval.api.scorer_factory`)."""
    return scorer_factory(_model_options(args), models)


def _image_map(args: argparse.Namespace) -> dict[str, str] | None:
    """The `--image-map` file, when given."""
    return image_map_table(getattr(args, "image_map", None))


def _images_dir(args: argparse.Namespace) -> Path | None:
    """The `--images` folder (checked)."""
    return images_folder(getattr(args, "images", None))


_json_safe = json_safe


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
        print(name.ljust(width) + cells + note)


def run_correlate(args: argparse.Namespace) -> int:
    """`pacs correlate`: run a benchmark for every metric and print (and optionally save) the table."""
    run = run_correlation(correlation_request(args))  # the library's implementation (eval.correlate's table)
    print(f"{run.benchmark.name}: {run.benchmark.description}")
    print_table(run.results)
    for key, value in run.notes.items():
        print(f"{key}: {value}")
    if args.json:
        write_json_atomic(args.json, run.table)
        print(f"-> {args.json}")
    return 0


def run_evaluate(args: argparse.Namespace) -> int:
    """`pacs evaluate`: the captioning table of a candidate file against references (and images)."""
    from eval import fluency
    from eval.grammar import build_grammar_checker, grammar_error_rate
    from eval.text_metrics import compute_text_metrics
    from metric.scoring.inputs import load_candidates, load_references, references_for

    seed_everything(args.seed)
    candidates = load_candidates(args.candidates)
    references = references_for(candidates, load_references(args.references), args.references)
    captions = [c.caption for c in candidates]
    model_given = bool(getattr(args, "checkpoint", None) or getattr(args, "backbone", None))
    if args.metrics:
        metrics = parse_metric_list(args.metrics)
    else:
        metrics = list(DEFAULT_EVALUATE_METRICS)
        if args.images and model_given:
            metrics += ["clip-s", "ref-clip-s"] if not getattr(args, "checkpoint", None) else ["pac-s++", "ref-pac-s++"]
    table: dict[str, Any] = {}
    unavailable: dict[str, str] = {}
    failed: dict[str, dict[str, Any]] = {}
    empty = sum(not c.strip() for c in captions)
    if empty:
        log.warning("%d empty candidate caption(s) are scored as empty strings", empty)

    text = [m for m in metrics if get_metric(m).kind == "text"]
    if text:
        for name, value in compute_text_metrics(captions, references, text,
                                                spice_corenlp=args.spice_corenlp).items():
            table[name] = value.corpus if value.available else None
            if not value.available:
                unavailable[name] = value.reason
            if value.n_failed:
                failed[name] = {"n": value.n_failed, "items": [candidates[row].key for row in value.failed]}
    contrastive = [m for m in metrics if get_metric(m).kind == "contrastive"]
    models: dict[str, Any] = {}
    if contrastive:
        keep, paths = bench.resolve_images(
            bench.RunContext(Path("."), MetricSuite(contrastive), _images_dir(args), _image_map(args),
                             args.skip_missing_images), [c.key for c in candidates])
        if not keep.all():
            log.warning("contrastive metrics computed on %d of %d captions (missing images)", keep.sum(), len(keep))
        index = np.flatnonzero(keep)
        suite = MetricSuite(contrastive, _scorer_factory(args, models))
        scores = suite.score([captions[i] for i in index], [references[i] for i in index], [str(paths[i]) for i in index])
        for name, values in scores.items():
            table[name] = float(np.mean(values)) if len(values) else None
    grammar_backend = None
    for name in metrics:
        if name.startswith("rep"):
            table[name] = fluency.rep_n(captions, int(name[3:]))
        elif name == "incorrect":
            table[name] = fluency.incorrect_rate(captions)
        elif name == "grammar":
            try:
                checker = build_grammar_checker(args.grammar_backend, jar_dir=args.languagetool_jar_dir,
                                                url=args.languagetool_url)
                result = grammar_error_rate(captions, checker)
                table[name], grammar_backend = result.rate, result.backend
            except InputError:
                raise
            except PacsError as error:  # a missing optional backend must not sink the whole table
                table[name] = None
                unavailable[name] = str(error)
        elif name == "length":
            table[name] = float(np.mean([len(c.split()) for c in captions]))
    table = {name: table.get(name) for name in metrics}
    print(f"{len(captions)} captions, {len({c.key for c in candidates})} images")
    for name, value in table.items():
        suffix = f"  [{grammar_backend}]" if name == "grammar" and grammar_backend else ""
        reason = f"  (unavailable: {unavailable[name]})" if name in unavailable else ""
        if name in failed:
            reason += f"  (failed on {failed[name]['n']} of {len(captions)} captions, mean over the others)"
        print(f"{name:<12} {_format(value)}{suffix}{reason}")
    if args.json:
        output = {"metrics": table, "n": len(captions), "n_empty": empty, "grammar_backend": grammar_backend,
                  "unavailable": unavailable, "failed": failed,
                  "provenance": provenance(seed=args.seed, w=getattr(args, "w", None), config={
                      "candidates": str(args.candidates), "references": str(args.references), "metrics": metrics,
                      "images": args.images, "checkpoint": getattr(args, "checkpoint", None),
                      "backbone": getattr(args, "backbone", None), "grammar_backend": args.grammar_backend},
                      models=models)}
        write_json_atomic(args.json, _json_safe(output))
        print(f"-> {args.json}")
    return 0


def _add_common(parser: argparse.ArgumentParser) -> None:
    """Options shared by correlate and evaluate."""
    parser.add_argument("--images", metavar="DIR", help="image folder (DIR/<image_id>[.jpg|.jpeg|.png])")
    parser.add_argument("--image-map", metavar="FILE", help='{"image_id": "path"} (overrides --images)')
    parser.add_argument("--skip-missing-images", action="store_true",
                        help="skip items whose image is missing (for every metric) instead of failing")
    parser.add_argument("--json", metavar="FILE", help="write the result table as JSON (atomically)")
    parser.add_argument("--seed", type=int, default=0, help="seed for sampling and bootstrap")
    parser.add_argument("--spice-corenlp", metavar="DIR",
                        help="folder with stanford-corenlp-3.6.0.jar and -models.jar for SPICE "
                             "(or $PACS_SPICE_CORENLP)")
    from metric.commands.score import add_model_options

    add_model_options(parser)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add this package's sub-commands to the `pacs` parser."""
    correlate = subparsers.add_parser(
        "correlate", help="correlate metrics with human judgments on a benchmark",
        description="Run a human-judgment benchmark for any registered metric.")
    correlate.add_argument("benchmark", help=f"one of: {' '.join(bench.benchmark_names())}")
    correlate.add_argument("--data", required=True, metavar="DIR|FILE", help="the benchmark's data folder or file")
    correlate.add_argument("--metrics", required=True, help="comma-separated metric names (e.g. bleu4,cider,clip-s)")
    correlate.add_argument("--bootstrap", type=int, default=0, metavar="N",
                           help="N bootstrap resamples: 95%% intervals and paired p-values against the best metric")
    _add_common(correlate)
    group = correlate.add_argument_group("benchmark options")
    for name in bench.benchmark_names():
        try:
            benchmark = bench.get_benchmark(name)
        except (InputError, ImportError):
            continue
        if benchmark.options_class is not None:  # the flags come from the options dataclass (one source)
            add_dataclass_options(group, benchmark.options_class)
    correlate.set_defaults(func=run_correlate)

    evaluate = subparsers.add_parser(
        "evaluate", help="the captioning table: BLEU, METEOR, ROUGE-L, CIDEr, SPICE, CLIP-S/PAC-S++, Rep-n, ...",
        description="Evaluate candidate captions against references (and images).")
    evaluate.add_argument("--candidates", required=True, metavar="FILE",
                          help='{"image_id": "caption"} or [{"image_id", "caption"}]')
    evaluate.add_argument("--references", required=True, metavar="FILE",
                          help='{"image_id": [refs]} or COCO annotations')
    evaluate.add_argument("--metrics", help=f"comma-separated (default: {','.join(DEFAULT_EVALUATE_METRICS)}, "
                                            "plus clip-s/pac-s++ and their Ref- variants with --images and a model)")
    evaluate.add_argument("--grammar-backend", default="harper", help="harper (offline, default) or languagetool")
    evaluate.add_argument("--languagetool-jar-dir", metavar="DIR", help="local LanguageTool folder")
    evaluate.add_argument("--languagetool-url", metavar="URL", help="LanguageTool server URL")
    _add_common(evaluate)
    evaluate.set_defaults(func=run_evaluate)


