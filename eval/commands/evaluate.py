"""`pacs evaluate`: the captioning table of one candidate file, or a system-level table of several systems
(and a human baseline) with bootstrap intervals (`pacs.eval.system_table`)."""
from __future__ import annotations

import argparse
import logging
import math
from pathlib import Path
from typing import Any

from pacs.eval.system_table import DEFAULT_BOOTSTRAP, DEFAULT_EVALUATE_METRICS

log = logging.getLogger(__name__)


def _metrics(args: argparse.Namespace) -> list[str]:
    """The requested metrics (canonical names), or the defaults."""
    from pacs.eval.registry import parse_metric_list
    from pacs.eval.system_table import default_metrics

    if args.metrics:
        return parse_metric_list(args.metrics)
    return default_metrics(args.images, getattr(args, "checkpoint", None), getattr(args, "backbone", None),
                           args.metric_model)


def _java_checked(args: argparse.Namespace, metrics: list[str]) -> list[str]:
    """`metrics`, checked for Java before anything is scored: a metric that needs it (METEOR, SPICE), or the Java
    PTB tokenizer, asked for on a machine without Java is refused in one line; the defaults leave them out with a
    warning."""
    from pacs.eval.java_metrics import java_metric_names, missing_java_problems
    from pacs.eval.java_runtime import java_executable
    from pacs.metric.common.errors import InputError

    if args.ptb_tokenizer == "java" and java_executable() is None:
        raise InputError("--ptb-tokenizer java needs Java (pycocoevalcap's PTBTokenizer jar) but no `java` was "
                         "found: install a JRE or use --ptb-tokenizer python (the default, equal to Java's)")
    problems = missing_java_problems(metrics)
    if problems and args.metrics:
        raise InputError("; ".join(problems))
    if problems:
        dropped = java_metric_names(metrics)
        log.warning("%s left out: no Java found (install a JRE, or point PACS_JAVA / JAVA_HOME at one, to get "
                    "them)", ", ".join(dropped))
        metrics = [m for m in metrics if m not in dropped]
    return metrics


def _scoring_options(args: argparse.Namespace, metrics: list[str]) -> Any:
    """The scoring options of the parsed flags."""
    from pacs.eval.correlate_run import image_map_table, images_folder
    from pacs.eval.system_scoring import ScoringOptions

    return ScoringOptions(metrics=metrics, images=images_folder(args.images), image_map=image_map_table(args.image_map),
                          skip_missing_images=args.skip_missing_images, spice_corenlp=args.spice_corenlp,
                          grammar_backend=args.grammar_backend, languagetool_jar_dir=args.languagetool_jar_dir,
                          languagetool_url=args.languagetool_url, ptb_tokenizer=args.ptb_tokenizer,
                          tokenized=args.tokenized)


def _is_table(args: argparse.Namespace) -> bool:
    """True for a system-level table: several systems, a NAME=FILE pair, a human baseline or table outputs."""
    single = args.candidates[0] if len(args.candidates) == 1 else None
    plain = single is not None and ("=" not in single or Path(single).is_file())
    return not plain or bool(args.human_baseline or args.csv or args.plot or args.html or args.baseline
                             or args.bootstrap_recompute_corpus or args.latex or args.markdown)


def _candidate_files(specs: list[str]) -> list[tuple[str, str]]:
    """(`--candidates NAME`, FILE) of each `NAME=FILE` or plain FILE (the rule of `parse_candidate_specs`)."""
    files = []
    for text in specs:
        if "=" in text and not Path(text).is_file():
            name, _, file = text.partition("=")
            files.append((f"--candidates {name.strip()}", file))
        else:
            files.append(("--candidates", text))
    return files


def _derived_csv(args: argparse.Namespace) -> str | None:
    """The table's CSV path: `--csv`, else (with `--out`) the CSV next to it, refused when a file is there already
    (an existing file that was not named as an output is never overwritten)."""
    from pacs.metric.common.output_paths import check_unnamed_output

    if args.csv or not args.json:
        return args.csv
    path = str(Path(args.json).with_suffix(".csv"))
    check_unnamed_output(path, f"the CSV written next to --out {args.json}",
                         f"name the CSV with --csv FILE (--csv {path} replaces it)")
    return path


def check_evaluate_outputs(args: argparse.Namespace, table: bool) -> str | None:
    """Refuse (InputError, before any work) an output of `pacs evaluate` that is one of its inputs or another output,
    and a derived CSV that would overwrite an existing file; the table's CSV path (None for one file)."""
    from pacs.metric.common.output_paths import Folder, check_outputs, model_inputs, path_inputs
    from pacs.metric.scoring.image_lookup import IMAGE_SUFFIXES

    outputs = [("--out", args.json)]
    if table:
        outputs += [("--csv", args.csv), ("--plot", args.plot), ("--html", args.html), ("--latex", args.latex),
                    ("--markdown", args.markdown)]
    model_files, model_folders = model_inputs(args)
    folders = [Folder("--images", args.images, IMAGE_SUFFIXES), *model_folders]
    for flag in ("spice_corenlp", "languagetool_jar_dir"):
        folders += path_inputs("--" + flag.replace("_", "-"), getattr(args, flag, None))[1]
    inputs = [*_candidate_files(list(args.candidates)), ("--references", args.references),
              ("--image-map", args.image_map), *model_files]
    check_outputs(outputs, inputs, folders)
    if not table:
        return None
    csv_path = _derived_csv(args)
    if csv_path != args.csv:
        check_outputs([*outputs, ("the CSV next to --out", csv_path)], inputs, folders)
    return csv_path


def _format(value: Any, scale: float = 1.0) -> str:
    """A table cell (times its printed scale: text metrics ×100)."""
    from pacs.eval.system_table import printed_value

    if isinstance(value, float):
        return printed_value(value, scale) if math.isfinite(value) else "nan"
    return "-" if value is None else str(value)


def run_single(args: argparse.Namespace) -> int:
    """One candidate file: the metric lines and the JSON `{"metrics", "n", ...}` (the same scoring as a table row)."""
    from pacs.eval import columns
    from pacs.eval.metric_models import check_columns, column_factory, parse_metric_models
    from pacs.eval.system_inputs import canonical_rows, parse_candidate_specs
    from pacs.eval.system_scoring import SharedScoring, score_rows
    from pacs.metric.common.io import nonfinite_to_none, write_json_atomic
    from pacs.metric.common.provenance import provenance
    from pacs.metric.common.seeding import seed_everything
    from pacs.metric.scoring.model_options import ModelOptions, scoring_conventions
    from pacs.metric.scoring.score_inputs import load_references

    check_evaluate_outputs(args, table=False)
    seed_everything(args.seed)
    (spec,) = parse_candidate_specs(args.candidates)
    references = load_references(args.references)
    ids, captions = canonical_rows(spec.path, references, unique=False)
    metrics = _java_checked(args, _metrics(args))
    models: dict[str, Any] = {}
    model = ModelOptions.from_mapping(args)
    conventions = scoring_conventions(model)
    metric_models = parse_metric_models(args.metric_model)
    check_columns(metrics, metric_models)
    shared = SharedScoring(_scoring_options(args, metrics), column_factory(model, metric_models, models))
    result = score_rows(shared, ids, captions, [references[key] for key in ids])
    failed = {m: {"n": len(rows), "items": [ids[r] for r in rows]} for m, rows in result.failed.items()}
    print(f"{len(captions)} captions, {len(set(ids))} images")
    for name, value in result.values.items():
        suffix = f"  [{result.grammar_backend}]" if name == "grammar" and result.grammar_backend else ""
        reason = f"  (unavailable: {result.unavailable[name]})" if name in result.unavailable else ""
        if name in failed:
            reason += f"  (failed on {failed[name]['n']} of {len(captions)} captions, mean over the others)"
        scale = columns.printed_scale(name)
        print(f"{name:<12} {_format(value, scale)}{suffix}{reason}{'  (×100)' if scale != 1.0 else ''}")
    for name, count in result.truncated.items():
        if count:
            print(f"{name}: {count} of {len(captions)} captions cut to the text context "
                  f"(long_captions={conventions['long_captions']})")
    if args.json:
        output = {"metrics": result.values, "printed_scale": {m: columns.printed_scale(m) for m in metrics},
                  "n": len(captions), "n_empty": result.n_empty,
                  "grammar_backend": result.grammar_backend, "unavailable": result.unavailable, "failed": failed,
                  "truncated_captions": result.truncated,
                  "provenance": provenance(seed=args.seed, w=getattr(args, "w", None), config={
                      "candidates": str(spec.path), "references": str(args.references), "metrics": metrics,
                      "images": args.images, "checkpoint": getattr(args, "checkpoint", None),
                      "backbone": getattr(args, "backbone", None), "grammar_backend": args.grammar_backend,
                      "metric_models": {m: spec.spec for m, spec in metric_models.items()}, **conventions},
                      models=models)}
        write_json_atomic(args.json, nonfinite_to_none(output))
        print(f"-> {args.json}")
    return 0


def run_table(args: argparse.Namespace) -> int:
    """Several systems (and the human baseline): print the table, write JSON / CSV / PNG / HTML."""
    from pacs.eval.system_table import TableRequest, build_system_table, table_text, write_table
    from pacs.metric.common.terminal import escape_control
    from pacs.metric.scoring.model_options import ModelOptions

    csv_path = check_evaluate_outputs(args, table=True)
    metrics = _java_checked(args, _metrics(args))
    request = TableRequest(
        candidates=list(args.candidates), references=args.references, metrics=metrics,
        scoring=_scoring_options(args, metrics), model=ModelOptions.from_mapping(args), seed=args.seed,
        bootstrap=args.bootstrap, human_baseline=args.human_baseline, equal_refs=args.human_baseline_equal_refs,
        skip_single_reference_images=args.skip_single_reference_images, baseline=args.baseline,
        recompute_corpus=args.bootstrap_recompute_corpus, metric_models=args.metric_model)
    table = build_system_table(request)
    print(escape_control(table_text(table), newlines=False))  # system names are the user's text
    intervals = bool(args.baseline) if args.paper_intervals is None else args.paper_intervals
    for path in write_table(table, args.json, csv_path, args.plot, args.html, args.latex, args.markdown,
                            paper_intervals=intervals):
        print(f"-> {path}")
    return 0


def run_evaluate(args: argparse.Namespace) -> int:
    """`pacs evaluate`: one candidate file's table, or a system-level table."""
    return run_table(args) if _is_table(args) else run_single(args)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `evaluate` sub-command to the `pacs` parser."""
    from pacs.eval.commands.correlate import add_common_options

    evaluate = subparsers.add_parser(
        "evaluate", help="the captioning table: BLEU, METEOR, ROUGE-L, CIDEr, SPICE, CLIP-S/PAC-S++, Rep-n, ...",
        description="Evaluate candidate captions against references (and images): one file, or a system-level "
                    "table of several systems (NAME=FILE) with a human baseline and bootstrap intervals.")
    evaluate.add_argument("--candidates", required=True, nargs="+", metavar="NAME=FILE",
                          help='one FILE, or NAME=FILE per system; {"image_id": "caption"} or '
                               '[{"image_id", "caption"}] (a plain FILE is named after its stem)')
    evaluate.add_argument("--references", required=True, metavar="FILE",
                          help='{"image_id": [refs]} or COCO annotations')
    evaluate.add_argument("--metrics", help=f"comma-separated (default: {','.join(DEFAULT_EVALUATE_METRICS)}, "
                                            "plus clip-s/pac-s++ and their Ref- variants with --images and a model)")
    evaluate.add_argument("--ptb-tokenizer", choices=("python", "java"), default="python",
                          help="the PTB tokenization of the text metrics: python (default, no Java; equal to "
                               "pycocoevalcap's on the shared data sets) or java (pycocoevalcap's jar)")
    evaluate.add_argument("--tokenized", action="store_true",
                          help="captions and references are tokenized already (space-joined tokens, scored as "
                               "given); default: PTB-tokenized first, lower-cased and without punctuation")
    evaluate.add_argument("--grammar-backend", default="harper", help="harper (offline, default) or languagetool")
    evaluate.add_argument("--languagetool-jar-dir", metavar="DIR", help="local LanguageTool folder")
    evaluate.add_argument("--languagetool-url", metavar="URL", help="LanguageTool server URL")
    table = evaluate.add_argument_group("system-level table")
    table.add_argument("--human-baseline", action="store_true",
                       help="add a human row: per image one reference (chosen with --seed) scored against the others")
    table.add_argument("--human-baseline-equal-refs", action="store_true",
                       help="score every system against the human row's remaining references too (default: "
                            "systems keep all references, the papers' protocol)")
    table.add_argument("--skip-single-reference-images", action="store_true",
                       help="with --human-baseline, leave out (and count) images with fewer than 2 references")
    table.add_argument("--baseline", metavar="NAME",
                       help="the row every system is compared with (paired bootstrap; default: the human row)")
    table.add_argument("--bootstrap", type=int, default=DEFAULT_BOOTSTRAP, metavar="N",
                       help=f"image resamples for the 95%% intervals (default {DEFAULT_BOOTSTRAP}; 0: none)")
    table.add_argument("--bootstrap-recompute-corpus", action="store_true",
                       help="recompute CIDEr-D (document frequencies included) and METEOR's corpus aggregate on "
                            "every resample (costly: a CIDEr-D run and a METEOR jar aggregation per resample; "
                            "default: their per-caption values are resampled)")
    table.add_argument("--csv", metavar="FILE", help="write the table as CSV (default: next to --out, where no file is there yet; an "
                            "existing one is replaced only when named here)")
    table.add_argument("--plot", metavar="FILE.png", help="write a heat map (rows x metrics, normalised per metric)")
    table.add_argument("--html", metavar="FILE", help="write an HTML page with the table, intervals and heat map")
    table.add_argument("--latex", metavar="FILE.tex",
                       help="write the table as a LaTeX tabular (booktabs): reference-based / reference-free / "
                            "fluency column groups as in the papers; bold: the best per column when its paired "
                            "interval against the runner-up excludes 0, else every row not separated from it")
    table.add_argument("--markdown", metavar="FILE.md",
                       help="write the table as Markdown (the same groups and bold rule)")
    table.add_argument("--paper-intervals", action=argparse.BooleanOptionalAction, default=None,
                       help="each --latex / --markdown cell followed by its 95%% bootstrap interval (default: on "
                            "with --baseline, off without)")
    evaluate.add_argument("--metric-model", action="append", metavar="METRIC=SPEC",
                          help="the model of one contrastive column, repeatable: METRIC=SOURCE[,arch=FILE]"
                               "[,family=NAME][,w=NUMBER]; SOURCE is a checkpoint when it is an existing file or "
                               "folder, else a backbone (e.g. clip-s=ViT-B-32/FILE pac-s=clip_ViT-B-32.pth "
                               "pac-s++=PAC++_clip_ViT-B-32.pth); it also scores the metric's Ref- variant; "
                               "columns without one use --checkpoint / --backbone")
    add_common_options(evaluate)
    evaluate.set_defaults(func=run_evaluate)
