"""`pacs report RUN_DIR`: regenerate the HTML report of a run directory."""
from __future__ import annotations

import argparse

from pacs.metric.common.terminal import escape_control


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `report` sub-command to the `pacs` parser."""
    parser = subparsers.add_parser("report", help="write RUN_DIR/report.html from the files of a run directory",
                                   description="Write a self-contained HTML report (results table, training "
                                               "curves, correlation plots, gallery) from a run directory.")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run directory (e.g. runs/demo)")
    parser.add_argument("--out", default=None, help="output HTML file (default: RUN_DIR/report.html)")
    parser.set_defaults(func=run_report)


def run_report(args: argparse.Namespace) -> int:
    """Build the report and print where it was written."""
    from pacs.eval.report import write_report

    path = write_report(args.run_dir, args.out)
    print(escape_control(f"report written to {path}"))
    return 0
