"""Make `accelerate launch --cpu --num_processes N` start N gloo CPU processes.

accelerate's `--cpu` launcher starts a single process unless MPI is installed (it only sets `MASTER_ADDR` /
`MASTER_PORT` and runs the script once), so a user asking for two CPU processes silently gets one. The recipes
call `relaunch_cpu_processes()` first: when they find themselves in that situation they re-execute under
`torch.distributed.run` with the requested number of processes - the same launcher accelerate uses for
`--multi_gpu`, which on CPU (`ACCELERATE_USE_CPU`) gives DDP over gloo.
"""
from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Callable, Mapping, Sequence

from pacs.metric.common.errors import PacsError

logger = logging.getLogger(__name__)

WORKING_COMMAND = "ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes N SCRIPT ..."
_DISTRIBUTED_MARKERS = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")


class LaunchError(PacsError):
    """The launcher asked for several CPU processes but how many could not be determined."""


def launcher_arguments(parent_argv: Sequence[str]) -> list[str] | None:
    """The `accelerate launch` options in a parent command line, or None when the parent is not that launcher."""
    for index, token in enumerate(parent_argv):
        if token == "launch" and index > 0 and os.path.basename(parent_argv[index - 1]).startswith("accelerate"):
            return list(parent_argv[index + 1:])
        if token == "accelerate.commands.launch" and index > 0 and parent_argv[index - 1] == "-m":
            return list(parent_argv[index + 1:])
    return None


def requested_processes(launch_argv: Sequence[str]) -> int | None:
    """`--num_processes` as accelerate's own parser reads it, else the (given or default) config file's, else None."""
    from accelerate.commands.config import default_config_file
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import launch_command_parser

    args, _ = launch_command_parser().parse_known_args(list(launch_argv))
    if args.num_processes is not None:
        return int(args.num_processes)
    config_file = args.config_file or (default_config_file if os.path.isfile(default_config_file) else None)
    if config_file is not None:
        count = getattr(load_config_from_file(config_file), "num_processes", None)
        return int(count) if count is not None else None
    return None


def cpu_processes_to_start(env: Mapping[str, str],
                           parent_argv: Sequence[str] | Callable[[], Sequence[str] | None] | None) -> int:
    """How many processes `relaunch_cpu_processes` must start (0: nothing to do).

    Non-zero only inside accelerate's single-process CPU launcher that was asked for several processes: CPU
    requested, `MASTER_ADDR` set (accelerate sets it only when `num_processes > 1`) and no distributed rank
    variables (torchrun, MPI). `parent_argv` is the parent's command line (or a function reading it, called only
    in that situation); None means it could not be read, and then a LaunchError says so rather than silently
    running one process.
    """
    from accelerate.utils import str_to_bool  # how accelerate itself reads ACCELERATE_USE_CPU

    if not str_to_bool(env.get("ACCELERATE_USE_CPU", "false")) or "MASTER_ADDR" not in env:
        return 0
    if any(marker in env for marker in _DISTRIBUTED_MARKERS):
        return 0
    if callable(parent_argv):
        parent_argv = parent_argv()
    if parent_argv is None:
        raise LaunchError("this looks like accelerate's CPU launcher asked for several processes, but pacs cannot "
                          "read the launcher's command line (the parent process) to tell how many; rather than "
                          f"silently running one process it stops here. Use: {WORKING_COMMAND}")
    launch_argv = launcher_arguments(parent_argv)
    if launch_argv is None:
        return 0
    count = requested_processes(launch_argv)
    if count is None:
        raise LaunchError("accelerate was asked for several CPU processes but pacs cannot tell how many; "
                          f"pass --num_processes N, or use: {WORKING_COMMAND}")
    return count if count > 1 else 0


def _parent_command_line() -> list[str] | None:
    """The command line of the process that started this one (None, logged, when it cannot be read)."""
    try:
        import psutil

        return psutil.Process(os.getppid()).cmdline()
    except Exception as error:  # noqa: BLE001 - any failure means "unknown", which the caller reports
        logger.warning("cannot read the command line of the parent process %d: %s", os.getppid(), error)
        return None


def _master_port(env: Mapping[str, str]) -> str:
    """The rendezvous port: accelerate's `--main_process_port`, a free one for 0 (torchrun would wait forever)."""
    port = env.get("MASTER_PORT", "29500")
    if port != "0":
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


def relaunch_cpu_processes() -> None:
    """Under `accelerate launch --cpu --num_processes N` (N > 1, no MPI), re-execute this script as N processes."""
    count = cpu_processes_to_start(os.environ, _parent_command_line)
    if not count:
        return
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(count),
               "--master_addr", os.environ["MASTER_ADDR"], "--master_port", _master_port(os.environ), *sys.argv]
    logger.info("accelerate's --cpu launcher starts one process; starting %d gloo CPU processes with torchrun",
                count)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, command, dict(os.environ, ACCELERATE_USE_CPU="true"))
