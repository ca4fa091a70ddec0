"""`pacs report RUN_DIR`: regenerate the HTML report of a run directory."""
from __future__ import annotations

import argparse
from pathlib import Path

from pacs.metric.common.errors import InputError
from pacs.metric.common.terminal import escape_control


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `report` sub-command to the `pacs` parser."""
    parser = subparsers.add_parser("report", help="write RUN_DIR/report.html from the files of a run directory",
                                   description="Write a self-contained HTML report (results table, training "
                                               "curves, correlation plots, gallery) from a run directory.")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run directory (e.g. runs/demo)")
    parser.add_argument("--out", default=None, help="output HTML file (default: RUN_DIR/report.html)")
    parser.set_defaults(func=run_report)


def check_report_output(run_dir: str, out: str | None) -> None:
    """Refuse (InputError, before any work) an `--out` that is one of the files the report is built from (the
    results, logs, records, gallery images of RUN_DIR) or RUN_DIR itself."""
    from pacs.eval.report_inputs import has_results, report_inputs
    from pacs.metric.common.output_paths import check_outputs, same_file

    if out is None or not Path(run_dir).is_dir():
        return  # the default RUN_DIR/report.html is no input; a missing RUN_DIR is write_report's one line
    if same_file(out, run_dir):
        raise InputError(f"--out {out} is the run directory {run_dir}: an output never replaces an input; nothing "
                         "was written: choose another path")
    if has_results(Path(run_dir)):
        check_outputs([("--out", out)], [(f"the report of {run_dir}", path) for path in report_inputs(run_dir)])


def run_report(args: argparse.Namespace) -> int:
    """Build the report and print where it was written."""
    from pacs.eval.report import write_report

    check_report_output(args.run_dir, args.out)
    path = write_report(args.run_dir, args.out)
    print(escape_control(f"report written to {path}"))
    return 0
