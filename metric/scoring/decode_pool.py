"""Image decoding in worker processes, ahead of the model, into shared memory.

PIL releases the GIL while it decodes and resizes, but the PIL→tensor conversion and the Python around it hold
it, so decoding threads stop scaling after a few cores and compete with the thread that drives the towers.
`DecodePool` runs the decoding function in `workers` forked processes (persistent: started once, reused by
every call) and has each write its images straight into a batch buffer in shared memory, so the parent neither
decodes nor copies pixels: it waits for a batch while the towers (or, on an accelerator, the device) work on the
previous one. Up to `ahead` batches are in flight (bounded memory: `prefetch_batches`). The function runs the same deterministic
code per image as the serial path, so every pixel equals the serial one bit for bit, in input order.

Inputs of fewer than `MIN_IMAGES` images do not pay for the pool: callers decode them in their own process
(`pacs.metric.common.parallel.ordered_map`). Processes are forked (the decoding function, a closure over the
backbone's preprocessing, is inherited rather than pickled); where fork does not exist the threads are used.
"""
from __future__ import annotations

import math
import multiprocessing
import os
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

import torch

#: fewer images than this are decoded in the calling process (a pool's start-up costs ~50 ms per worker)
MIN_IMAGES = 64
#: images per task: small enough that every worker gets a share of a batch, large enough to amortise the task
TASK_IMAGES = 16
#: pixels decoded ahead of the model by `prefetch_batches`, at most (and at most half the free shared memory)
PREFETCH_BYTES = 512 * 2**20

_FUNCTION: Callable[[Any], torch.Tensor] | None = None
_LIVE: weakref.WeakSet[DecodePool] = weakref.WeakSet()  # every open pool of this process (`close_all`)


def fork_available() -> bool:
    """Whether processes can be forked here (Linux, macOS); elsewhere decoding stays in threads."""
    return "fork" in multiprocessing.get_all_start_methods()


def prefetch_batches(batch_size: int, shape: Sequence[int], budget: int = PREFETCH_BYTES,
                     shared_free: int | None = None) -> int:
    """How many batches of pixels `[batch_size, *shape]` (fp32) to decode ahead: as many as `budget` bytes and half
    the free shared memory hold (`shared_free`, default: /dev/shm's), at least 2.

    Deep enough that decoding goes on while the towers embed the texts (a `Scorer.score` call embeds them first),
    so the images need not wait for the text phase to end; bounded because every batch in flight is a buffer in
    shared memory (a container's /dev/shm may be small).
    """
    if shared_free is None:
        try:
            found = os.statvfs("/dev/shm")
            shared_free = found.f_bavail * found.f_frsize
        except OSError:  # no /dev/shm (macOS): torch shares through files, bounded by the budget alone
            shared_free = budget * 2
    batch_bytes = max(1, batch_size * math.prod(shape) * 4)
    return max(2, min(budget, shared_free // 2) // batch_bytes)


def use_pool(n_images: int, workers: int) -> bool:
    """Whether `n_images` images with `workers` decoders go to a process pool (else the calling process)."""
    return workers >= 2 and n_images >= MIN_IMAGES and fork_available()


def _start_worker(function: Callable[[Any], torch.Tensor]) -> None:
    global _FUNCTION
    _FUNCTION = function
    torch.set_num_threads(1)  # one core per worker: the pool is the parallelism (as DataLoader's workers)


def _decode_into(buffer: torch.Tensor, offset: int, items: Sequence[Any]) -> tuple[int, BaseException] | None:
    """Write `function(item)` into `buffer[offset + i]`; the first failure as (its index in items, the error)."""
    assert _FUNCTION is not None
    for index, item in enumerate(items):
        try:
            pixels = _FUNCTION(item)
            if tuple(pixels.shape) != tuple(buffer.shape[1:]):
                raise ValueError(f"preprocessing gave pixels of shape {list(pixels.shape)}, expected "
                                 f"{list(buffer.shape[1:])}")
            buffer[offset + index].copy_(pixels)
        except Exception as error:  # noqa: BLE001 (raised in the parent, where the item's result is due)
            return index, error
    return None


class BatchError(Exception):
    """The decoding of item `index` (of the whole input) failed with `error`."""

    def __init__(self, index: int, error: BaseException) -> None:
        super().__init__(index, error)
        self.index, self.error = index, error


class DecodePool:
    """`workers` forked processes that run `function(item) -> pixels` and fill shared batch buffers, in order."""

    def __init__(self, function: Callable[[Any], torch.Tensor], workers: int, shape: Sequence[int]) -> None:
        self.workers = int(workers)
        self.shape = tuple(shape)
        self._executor = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("fork"),
                                             initializer=_start_worker, initargs=(function,))
        self._finalizer = weakref.finalize(self, _stop, self._executor)
        _LIVE.add(self)

    def close(self) -> None:
        """Stop the worker processes (also done when the pool is garbage collected)."""
        self._finalizer()
        _LIVE.discard(self)

    def _submit(self, start: int, items: Sequence[Any]) -> tuple[torch.Tensor, list[tuple[int, Future]]]:
        buffer = torch.empty((len(items), *self.shape), dtype=torch.float32).share_memory_()
        size = max(1, min(TASK_IMAGES, math.ceil(len(items) / self.workers)))
        tasks = [(start + offset, self._executor.submit(_decode_into, buffer, offset, items[offset:offset + size]))
                 for offset in range(0, len(items), size)]
        return buffer, tasks

    def batches(self, items: Sequence[Any], batch_size: int, ahead: int = 2) -> Iterator[torch.Tensor]:
        """Pixels `[n, *shape]` of each batch of `items`, in order, up to `ahead` batches decoded early.

        The first item that failed (in input order) raises `BatchError(index in items, its error)` where its
        batch is due. The first `ahead` batches are handed to a submitting thread when this is called, not at the
        first `next`: a batch's shared buffer costs tens of milliseconds to allocate (38 MB at batch 64, 224 px),
        which the caller's thread would otherwise pay before its own work (the texts) starts.
        """
        starts = iter(range(0, len(items), batch_size))
        pending: deque[Future] = deque()  # each: (buffer, decode tasks) once the submitting thread got to it
        submitter = ThreadPoolExecutor(1, thread_name_prefix="decode-submit")

        def fill() -> None:
            while len(pending) < max(1, ahead):
                start = next(starts, None)
                if start is None:
                    return
                pending.append(submitter.submit(self._submit, start, items[start:start + batch_size]))

        fill()

        def generate() -> Iterator[torch.Tensor]:
            try:
                while pending:
                    buffer, tasks = pending.popleft().result()
                    for start, task in tasks:
                        failure = task.result()
                        if failure is not None:
                            raise BatchError(start + failure[0], failure[1])
                    fill()
                    yield buffer
            finally:  # an error or an abandoned iterator: drop the work not started yet
                for job in pending:
                    if not job.cancel() and job.exception() is None:  # submitted: cancel its decode tasks
                        for _, task in job.result()[1]:
                            task.cancel()
                pending.clear()
                submitter.shutdown(wait=False)

        return generate()


def _stop(executor: ProcessPoolExecutor) -> None:
    """Shut `executor` down and end its workers now. Workers forked from a process that has threads can be stuck on
    a lock they inherited, and concurrent.futures joins its workers when the interpreter exits: a process whose
    pool was still open then never exits (a demo seed process did). Terminating them cannot lose work: the pool
    is only closed once its results are read or abandoned."""
    processes = list((getattr(executor, "_processes", None) or {}).values())  # no public handle on the workers
    manager = getattr(executor, "_executor_manager_thread", None)
    executor.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.terminate()
    for process in processes:
        process.join(timeout=5)
    for process in processes:  # SIGTERM can be held up (a handler inherited through fork, a loaded machine)
        if process.is_alive():
            process.kill()
            process.join()
    # The executor's manager thread joins the same workers: when it reaps one first, our join returns before
    # that thread has stored the exit code, and the worker still reads as alive. Its end means every worker is
    # reaped and recorded; the workers are dead by now, so it ends at once (the timeout guards a stuck queue).
    if manager is not None and manager.is_alive():
        manager.join(timeout=10)


def close_all() -> None:
    """Close every pool this process still has open (the end of a command or of a seed's process)."""
    for pool in list(_LIVE):
        pool.close()


def ordered_pixels(function: Callable[[Any], torch.Tensor], items: Sequence[Any], workers: int,
                   shape: Callable[[], Sequence[int]], batch_size: int = 64, ahead: int = 2,
                   fallback: Callable[[], Iterable[torch.Tensor]] | None = None) -> Iterator[torch.Tensor]:
    """`function(item)` of each item, in order: from a one-off `DecodePool` for large inputs, else `fallback()`.

    A failing item raises its own exception where its result is due (the items before it are yielded).
    """
    if not use_pool(len(items), workers):
        yield from (fallback() if fallback is not None else map(function, items))
        return
    pool = DecodePool(function, workers, shape())
    try:
        done = 0
        try:
            for buffer in pool.batches(items, batch_size, ahead):
                yield from buffer
                done += len(buffer)
        except BatchError as failure:
            for index in range(done, failure.index):  # the items of the failing batch that precede it
                yield function(items[index])
            raise failure.error from None
    finally:
        pool.close()
