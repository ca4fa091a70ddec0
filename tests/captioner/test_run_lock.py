"""One run at a time per run directory (issue 21 item 1): a second `pacs train` stops at once naming the holder,
a lock left by a killed run is taken over, and a run directory that cannot be used is one clear error."""
from __future__ import annotations

import errno
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pacs import cli as pacs_cli
from pacs.metric.common.run_lock import LOCK_NAME, RunDirectoryBusyError, RunDirectoryLock, hold_run_directory

HOLD = """
import sys, time
from pacs.metric.common.run_lock import RunDirectoryLock
lock = RunDirectoryLock(sys.argv[1])
lock.acquire()
print("held", flush=True)
time.sleep(120)
"""


@pytest.fixture
def holder(tmp_path: Path):
    """Another process holding the lock of tmp_path/runs/demo_smoke (SIGKILLed at the end)."""
    run_dir = tmp_path / "runs" / "demo_smoke"
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "held"
    yield run_dir, process
    process.kill()
    process.wait()


def test_a_second_train_on_a_held_run_directory_exits_2_naming_the_holder(holder, capsys):
    run_dir, process = holder
    code = pacs_cli.main(["train", "--config", "demo_smoke", f"runs_dir={run_dir.parent}", "threads=1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("pacs train: error: run directory ") and f"is in use by pid {process.pid} on host " in err[0]
    assert "wait for that run to finish, or use another run directory" in err[0]
    assert sorted(p.name for p in run_dir.iterdir()) == [LOCK_NAME]  # nothing was written


def test_a_lock_left_by_a_killed_run_is_taken_over_with_a_log_line(holder, caplog):
    run_dir, process = holder
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert json.loads((run_dir / LOCK_NAME).read_text())["pid"] == process.pid  # the dead holder's note is left
    with caplog.at_level(logging.WARNING, logger="pacs.metric.common.run_lock"), hold_run_directory(run_dir):
        note = json.loads((run_dir / LOCK_NAME).read_text())
        assert note["pid"] == os.getpid()
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and messages[0].startswith(
        f"run directory {run_dir}: taking over the lock left by pid {process.pid} on host {note['host']}, started ")
    assert messages[0].endswith(", which is no longer running")
    assert (run_dir / LOCK_NAME).read_text() == ""  # released cleanly: no note for the next run to take over


def test_the_lock_is_released_when_the_block_fails(tmp_path):
    with pytest.raises(RuntimeError), hold_run_directory(tmp_path / "run"):
        raise RuntimeError("stage failed")
    lock = RunDirectoryLock(tmp_path / "run")
    lock.acquire()  # free again
    with pytest.raises(RunDirectoryBusyError, match=f"in use by pid {os.getpid()} "):
        RunDirectoryLock(tmp_path / "run").acquire()  # another open file: refused even in this process
    lock.release()


def test_two_trains_started_together_one_runs_the_other_exits_2(tmp_path):
    """Two `pacs train` processes on one run directory, started at the same moment."""
    command = [sys.executable, "-m", "pacs.cli", "train", "--config", "demo_smoke", f"runs_dir={tmp_path}",
               "threads=1"]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    processes = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                  start_new_session=True) for _ in range(2)]
    try:
        deadline = time.monotonic() + 120
        while all(p.poll() is None for p in processes):
            assert time.monotonic() < deadline, "neither run stopped"
            time.sleep(0.05)
        loser = next(p for p in processes if p.poll() is not None)
        winner = next(p for p in processes if p is not loser)
        _, err = loser.communicate()
        assert loser.returncode == 2, err[-2000:]
        lines = [line for line in err.splitlines() if line.startswith("pacs train: error:")]
        assert len(lines) == 1 and f"is in use by pid {winner.pid} " in lines[0], err[-2000:]
        assert winner.poll() is None  # the other run goes on
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.communicate()


def test_a_run_directory_that_is_a_file_or_read_only_is_one_clear_error(tmp_path, capsys, monkeypatch):
    (tmp_path / "demo_smoke").write_text("not a folder")
    assert pacs_cli.main(["train", "--config", "demo_smoke", f"runs_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [(f"pacs train: error: run directory {tmp_path / 'demo_smoke'} is not a folder (a file is in the "
                   "way); remove it or choose another run directory")]
    # a read-only file system (simulated: root may write into a read-only folder)
    from pacs.metric.common import run_lock

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(args[0]))

    monkeypatch.setattr(run_lock, "open_no_follow", read_only)  # how run_lock opens the lock file
    assert pacs_cli.main(["train", "--config", "demo_smoke", f"runs_dir={tmp_path / 'ro'}"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        (f"pacs train: error: run directory {tmp_path / 'ro' / 'demo_smoke'} cannot be written (Read-only file "
        "system); make it writable or choose another run directory")]


def test_a_holder_that_has_not_yet_written_its_note_is_still_named(tmp_path):
    """The moment between a holder taking the lock and writing its note: the refusal waits for the note."""
    import fcntl
    import threading

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with open(run_dir / LOCK_NAME, "a+", encoding="utf-8") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # locked, note still empty

        def write_note() -> None:
            time.sleep(0.3)
            handle.write(json.dumps({"host": "elsewhere", "pid": 4242, "started": 0.0}))
            handle.flush()

        writer = threading.Thread(target=write_note)
        writer.start()
        try:
            with pytest.raises(RunDirectoryBusyError, match=r"is in use by pid 4242 on host elsewhere, started "):
                RunDirectoryLock(run_dir).acquire()
        finally:
            writer.join()


def test_a_holder_that_never_writes_its_note_is_another_process(tmp_path):
    """After waiting 2 s for a note that never comes, the refusal says "another process"."""
    import fcntl

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with open(run_dir / LOCK_NAME, "a+", encoding="utf-8") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(RunDirectoryBusyError, match=r"is in use by another process; wait for that run"):
            RunDirectoryLock(run_dir).acquire()
