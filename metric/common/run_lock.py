"""One run at a time per run directory: an OS file lock (`flock`) held for the whole run.

The main process of a launch takes an exclusive lock on `<run_dir>/.pacs.lock` and writes who holds it (host,
pid, start time, command) into that file; the other ranks of the same launch share it (they learn the outcome
from the main process, so every rank of a refused launch stops with the same error). A second run on the same
directory stops at once with an error naming the holder. The kernel releases the lock when its process ends,
however it ends, so a lock left by a killed run is taken over by the next one (with a log line naming it).
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pacs.metric.common.errors import InputError
from pacs.metric.common.link_safety import open_no_follow

logger = logging.getLogger(__name__)

LOCK_NAME = ".pacs.lock"


class RunDirectoryBusyError(InputError):
    """Another run holds the run directory's lock."""


def _holder_text(holder: dict[str, Any]) -> str:
    started = holder.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if isinstance(started, (int, float)) else "?"
    return f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}, started {when}"


def _read_holder(handle: Any) -> dict[str, Any] | None:
    """What the lock file says about its holder (None when empty or unreadable)."""
    handle.seek(0)
    try:
        holder = json.loads(handle.read() or "null")
    except (ValueError, RecursionError):
        return None
    return holder if isinstance(holder, dict) else None


def _wait_for_holder(handle: Any, patience_s: float = 2.0) -> dict[str, Any] | None:
    """The holder note, waiting briefly for a holder that has just taken the lock and not yet written it."""
    deadline = time.monotonic() + patience_s
    while (holder := _read_holder(handle)) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return holder


def _unwritable(run_dir: Path, error: OSError) -> InputError:
    if error.errno == errno.ENOTDIR or (run_dir.exists() and not run_dir.is_dir()):
        return InputError(f"run directory {run_dir} is not a folder (a file is in the way); remove it or choose "
                          "another run directory")
    return InputError(f"run directory {run_dir} cannot be written ({error.strerror}); make it writable or choose "
                      "another run directory")


class RunDirectoryLock:
    """The lock of one run directory, taken by `acquire` and given back by `release` (or use `hold_run_directory`)."""

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self._handle: Any = None

    def acquire(self) -> None:
        """Take the lock or raise RunDirectoryBusyError naming the holder; create the run directory if needed."""
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            handle = open_no_follow(self.path, "r+", encoding="utf-8")  # a link there: one error, nothing written
        except OSError as error:
            raise _unwritable(self.run_dir, error) from None
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _wait_for_holder(handle)
            handle.close()
            who = _holder_text(holder) if holder else "another process"
            raise RunDirectoryBusyError(
                f"run directory {self.run_dir} is in use by {who}; wait for that run to finish, or use another "
                "run directory") from None
        previous = _read_holder(handle)
        if previous:
            logger.warning("run directory %s: taking over the lock left by %s, which is no longer running",
                           self.run_dir, _holder_text(previous))
        me = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time(), "command": sys.argv}
        try:
            handle.seek(0)
            handle.truncate()
            handle.write(json.dumps(me))
            handle.flush()
        except OSError as error:
            handle.close()
            raise _unwritable(self.run_dir, error) from None
        self._handle = handle

    def release(self) -> None:
        """Give the lock back (the holder note is cleared so the next run finds a clean lock)."""
        if self._handle is None:
            return
        with contextlib.suppress(OSError):
            self._handle.seek(0)
            self._handle.truncate()
            self._handle.flush()
        fcntl.flock(self._handle.fileno(), fcntl.LOCK_UN)
        self._handle.close()
        self._handle = None


def _broadcast(outcome: tuple[str, bool] | None, state: Any) -> tuple[str, bool] | None:
    """The main process's outcome (refusal message, whether the directory is busy) on every rank."""
    if getattr(state, "num_processes", 1) <= 1:
        return outcome
    from accelerate.utils import broadcast_object_list

    box = [outcome]
    broadcast_object_list(box, from_process=0)
    return box[0]


@contextlib.contextmanager
def hold_run_directory(run_dir: str | os.PathLike, state: Any = None) -> Iterator[None]:
    """Hold `run_dir`'s lock for the block: the main process locks; every rank of a refused launch raises."""
    is_main = getattr(state, "is_main_process", True)
    lock = RunDirectoryLock(run_dir)
    refusal: tuple[str, bool] | None = None
    if is_main:
        try:
            lock.acquire()
        except InputError as error:
            refusal = (str(error), isinstance(error, RunDirectoryBusyError))
    refusal = _broadcast(refusal, state)
    if refusal is not None:
        message, busy = refusal
        raise (RunDirectoryBusyError if busy else InputError)(message)
    try:
        yield
    finally:
        lock.release()
