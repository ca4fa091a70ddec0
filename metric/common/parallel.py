"""The parallel input pipeline: images decoded and preprocessed by a pool of threads, ahead of the model.

`ordered_map(function, items, workers)` yields `function(item)` for every item in input order while up to
`ahead` items are computed by `workers` threads in the background, so the next batch is decoded while the model
encodes the current one. PIL decodes and resizes with the GIL released, so threads run on separate cores; the same
deterministic code runs per image, so every result equals the serial one bit for bit. `workers` 0 or 1 runs
`function` in the calling thread, one item at a time (the serial path). An item's exception is raised where its
result is due, so the first failing item in input order is the one reported, with its own message.
"""
from __future__ import annotations

import argparse
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from pacs.metric.common.errors import InputError

T = TypeVar("T")
R = TypeVar("R")

AUTO = "auto"
MAX_WORKERS = 256
WORKERS_HELP = ("threads that decode and preprocess images ahead of the model: auto (one per CPU core, shared "
                "by the processes of a launch; the default), 0 or 1 (in the calling thread) or N; results are "
                "identical for every value")
#: image decoding paths: cpu (PIL, exact) and gpu (nvJPEG + resize on the GPU, `pacs.metric.models.tensor_decode`)
DECODES = ("cpu", "gpu")
DECODE_HELP = ("image decoding: cpu (PIL, the exact path of the official code; default) or gpu (nvJPEG + "
               "antialiased resize on the CUDA device: faster, scores deviate slightly, see docs/performance.md)")


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the platform has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def auto_workers() -> int:
    """`auto`: the available cores shared by the processes of this machine (`LOCAL_WORLD_SIZE` under accelerate
    launch / torchrun), at least 1."""
    try:
        local_processes = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        local_processes = 1
    return max(1, available_cores() // local_processes)


def resolve_workers(workers: int | str | None, name: str = "workers") -> int:
    """The number of decoding threads: `auto` / None = `auto_workers()`, else an integer 0..MAX_WORKERS."""
    if workers is None or (isinstance(workers, str) and workers.strip().lower() == AUTO):
        return auto_workers()
    if isinstance(workers, bool):
        raise InputError(f"{name}={workers!r}: give auto or a number of threads (0..{MAX_WORKERS})")
    try:
        count = int(workers)
    except (TypeError, ValueError):
        raise InputError(f"{name}={workers!r}: give auto or a number of threads (0..{MAX_WORKERS})") from None
    if isinstance(workers, float) and count != workers:
        raise InputError(f"{name}={workers!r}: give auto or a whole number of threads (0..{MAX_WORKERS})")
    if not 0 <= count <= MAX_WORKERS:
        raise InputError(f"{name}={workers!r}: give auto or a number of threads between 0 and {MAX_WORKERS}")
    return count


def workers_option(value: str) -> int | str:
    """argparse type of a `--workers` flag: `auto` or a number of threads (checked by `resolve_workers`)."""
    try:
        resolve_workers(value, "--workers")
    except InputError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return AUTO if value.strip().lower() == AUTO else int(value)


def ordered_map(function: Callable[[T], R], items: Iterable[T], workers: int, ahead: int = 0) -> Iterator[R]:
    """`function(item)` for each item, in input order, computed by `workers` threads up to `ahead` items early.

    `ahead` (default: 2 × workers) bounds the memory held by finished results not yet consumed. With `workers`
    <= 1 the items are computed in the calling thread when their result is asked for.
    """
    if workers <= 1:
        yield from map(function, items)
        return
    ahead = max(ahead, workers, 1) if ahead else 2 * workers
    iterator = iter(items)
    pending: deque[Future[R]] = deque()
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pacs-decode") as pool:
        try:
            for item in iterator:
                pending.append(pool.submit(function, item))
                if len(pending) >= ahead:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:  # an error or an abandoned iterator: drop the work not started yet
            for future in pending:
                future.cancel()
