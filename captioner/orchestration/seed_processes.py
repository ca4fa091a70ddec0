"""Several training seeds, in turn or in parallel processes: the one way every run trains them (a recipe's `seeds:`
with `parallel_seeds:`, the demo's `seeds` / `parallel_seeds`).

In turn, each seed's work runs in this process, one after the other. In parallel (`parallel_seeds` > 1, on a
one-process CPU run: under `accelerate launch` the processes, and on an accelerator the card, are the run's, so the
seeds run in turn there), each seed's work runs in a spawned process with `threads` torch threads, its log lines
tagged `seed <s>` and kept in its own log file, its progress bars on a line of their own, its decoding workers
closed when it ends. What a seed's work returns comes back to the caller, keyed by seed, in the seeds' order.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pacs.captioner.orchestration.data_sources import registered_modules
from pacs.metric.common.progress import set_progress_tag

logger = logging.getLogger(__name__)


def parallel_seed_count(requested: int, seeds: Sequence[int], state: Any) -> int:
    """How many seeds train at once: `requested` (at most one per seed) on a one-process CPU run, else 1."""
    one_cpu_process = state.num_processes == 1 and str(getattr(state, "device", "cpu")) == "cpu"
    return min(requested, len(seeds)) if one_cpu_process else 1


def threads_per_seed(total: int | None, parallel: int) -> int:
    """Torch threads of each of `parallel` seed processes sharing `total` threads (None: this machine's cores)."""
    total = total if total is not None else len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else os.cpu_count() or 1
    return max(1, total // parallel)


def each_seed(seeds: Sequence[int], in_turn: Callable[[int], Any], worker: Callable[[int], Any], parallel: int,
              threads: int, log_file: Callable[[int], Path]) -> dict[int, Any]:
    """`{seed: result}` of every seed's work: `in_turn(seed)` one after the other in this process (`parallel` 1),
    else `worker(seed)` in `parallel` spawned processes at `threads` torch threads each (`worker` must pickle: a
    module-level function or a partial of one; `log_file(seed)`: its process's log file)."""
    seeds = list(seeds)
    if parallel <= 1:
        out = {}
        for seed in seeds:
            set_progress_tag(f"seed {seed}" if len(seeds) > 1 else "")
            out[seed] = in_turn(seed)
        set_progress_tag("")
        return out
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    logger.info("seeds %s: %d processes at %d torch thread(s) each", seeds, parallel, threads)
    with ProcessPoolExecutor(max_workers=parallel, mp_context=multiprocessing.get_context("spawn")) as pool:
        plugins = registered_modules()  # the data sets registered from above (the demo world): again in each child
        futures = [pool.submit(_seed_process, worker, seed, index, threads, log_file(seed), plugins)
                   for index, seed in enumerate(seeds)]
        return {seed: future.result() for seed, future in zip(seeds, futures)}


def _seed_process(worker: Callable[[int], Any], seed: int, position: int, threads: int, log_file: Path,
                  plugins: Sequence[str] = ()) -> Any:
    """One seed's work in a process of its own (`each_seed`): the `plugins` modules imported (they register data
    sets), logging, bars and threads set up, decoding workers closed at the end (the executor reuses the process,
    which must be able to exit)."""
    import importlib

    import torch

    for module in plugins:
        importlib.import_module(module)

    from pacs.metric.common.terminal import run_log, setup_terminal_logging
    from pacs.metric.scoring import decode_pool

    setup_terminal_logging(tag=f"seed {seed}")
    set_progress_tag(f"seed {seed}", position=position)  # each seed's bars on a line of their own
    torch.set_num_threads(threads)
    try:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with run_log(log_file):
            return worker(seed)
    finally:
        decode_pool.close_all()
