"""The `pacs` console script: one entry point that dispatches to sub-commands living next to what they run."""
from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from pacs.captioner.orchestration.launching import relaunch_cpu_processes
from pacs.metric.common.errors import PacsError
from pacs.metric.common.provenance import pacs_version
from pacs.metric.common.terminal import escape_control, setup_terminal_logging

# Modules that define sub-commands; each exposes `register(subparsers)` and sets `func` on its parsers.
COMMAND_MODULES = (
    "pacs.metric.commands.score",  # score
    "pacs.metric.commands.train",  # train-metric, generate-positives
    "pacs.metric.commands.score_video",  # score-video
    "pacs.metric.commands.export",  # export
    "pacs.eval.commands.correlate",  # correlate
    "pacs.eval.commands.evaluate",  # evaluate
    "pacs.eval.commands.report",  # report
    "pacs.captioner.commands.caption_train",  # caption, train
)
# Sub-commands that run process groups: `accelerate launch --cpu --num_processes N` re-executes them as N processes.
PROCESS_GROUP_COMMANDS = frozenset({"train", "train-metric"})
# Sub-commands whose work is kept in resumable stages or states: a full disk's message says a new run resumes.
STAGED_COMMANDS = frozenset({"train", "train-metric", "generate-positives"})


def build_parser() -> argparse.ArgumentParser:
    """Build the top-level parser with every registered sub-command."""
    parser = argparse.ArgumentParser(prog="pacs", description=__doc__)
    parser.add_argument("--log-level", default="INFO", help="logging level (DEBUG, INFO, WARNING, ...)")
    parser.add_argument("--version", action="version", version=f"pacs-captioning {pacs_version()}",
                        help="print the installed pacs-captioning version and exit")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run `pacs` with `argv`; user errors print one line on stderr and exit with status 2."""
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_terminal_logging(getattr(logging, str(args.log_level).upper(), logging.INFO))
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return _run(args)
    finally:
        pool = sys.modules.get("pacs.metric.scoring.decode_pool")  # loaded only if a command decoded images (torch)
        if pool is not None:
            pool.close_all()


def _run(args: argparse.Namespace) -> int:
    """`args.func(args)` with pacs' error contract: a user error is one line on stderr and status 2."""
    try:
        from pacs.metric.commands.flags import check_flag_bounds

        check_flag_bounds(args)  # the configs' bounds, before any work (one table: flags.FLAG_BOUNDS)
        if args.command in PROCESS_GROUP_COMMANDS:
            relaunch_cpu_processes()
        return int(args.func(args) or 0)
    except PacsError as error:
        from pacs.metric.commands.flags import cli_message  # library errors name parameters; the CLI prints flags

        print(f"pacs {args.command}: error: {escape_control(cli_message(error))}", file=sys.stderr)
        return 2
    except Exception as error:  # a full disk, a read-only or unwritable folder: the user's to fix, in one line
        from pacs.metric.common.os_errors import describe_os_error, os_error_of

        os_error = error if isinstance(error, OSError) else os_error_of(error)  # also safetensors' full disk
        message = describe_os_error(os_error, resumable=args.command in STAGED_COMMANDS) if os_error else None
        if message is None:
            raise
        print(f"pacs {args.command}: error: {escape_control(message)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
