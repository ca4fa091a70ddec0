"""XE -> SCST (chosen reward) -> evaluation from one YAML config.

    accelerate launch recipes/scst_pacs.py [--config YAML] [key=value ...]

With no arguments it runs the embedded default (recipes/configs/demo.yaml) into runs/demo/.
A stage whose recorded fingerprint (settings, inputs, upstream stages) is unchanged is skipped, a changed one
re-runs with everything below it; `--force STAGE` re-runs one stage; `--dry-run` says which would, writing
nothing. See docs/captioner.md.
"""
from __future__ import annotations

import argparse
import os
import sys

from pacs.captioner.entry import plan_from_config, run_from_config, run_summary
from pacs.captioner.orchestration.launching import relaunch_cpu_processes
from pacs.metric.common.os_errors import user_error_line
from pacs.metric.common.terminal import setup_terminal_logging


def main(argv: list[str] | None = None) -> int:
    """Parse `--config` and overrides, then run the pipeline."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=None,
                        help="recipe YAML file or packaged config name (default: demo = recipes/configs/demo.yaml)")
    parser.add_argument("--force", action="append", default=[], metavar="STAGE",
                        help="re-run STAGE (and every stage below it) from scratch; repeatable")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the stages in order, each reused, run, resumed or refused and why, and the "
                             "checks that ran; write nothing")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. xe.max_steps=100")
    args = parser.parse_args(argv)
    setup_terminal_logging()
    try:
        if args.dry_run:  # the plan reads the run folder and starts nothing; under a launcher rank 0 prints it
            plan = plan_from_config(args.config, args.overrides, force=args.force)
            if os.environ.get("RANK", "0") == "0":
                print(plan)
            return 0
        relaunch_cpu_processes()
        summary = run_summary(run_from_config(args.config, args.overrides, force=args.force))
        if summary:
            print(summary)  # the results table, results.json and report.html
    except Exception as error:  # user errors, a full disk (safetensors' too), an unwritable folder: one line, exit 2
        message = user_error_line(error, resumable=True)  # its stages are kept and resume
        if message is None:
            raise
        print(f"scst_pacs: error: {message}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
