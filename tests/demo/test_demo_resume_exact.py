"""A demo run SIGKILLed inside a learned-reward SCST stage and run again, and a `--force` of that stage, print the
same table as an uninterrupted run, bit for bit (issue 21 item 8): each stage scores with new scorers, so what a
process computed before (or skipped) does not change its floats. (The demo's SCST stages restart when
interrupted; mid-stage resume from a checkpoint is tested in tests/captioner/test_captioner_training.py, where the
restored reward caches make the difference. At this preset's size the 0.3.1 behaviour, scorers shared by every
stage of a process, happens to give the same floats too: this test guards the property, it does not reproduce
the 1.9e-4 difference measured on the full demo.)"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

STAGE = "seed-1/scst-pac-s++"  # the second training seed's (demo_smoke.yaml: seeds [0, 1])


def _command(runs: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "pacs.cli", "--log-level", "WARNING", "train", "--config", "demo_smoke",
            f"runs_dir={runs}", "threads=1", *extra]


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False,
                          env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert done.returncode == 0, done.stderr[-3000:]


def _outcome(run_dir: Path) -> tuple[dict, bytes]:
    results = json.loads((run_dir / "results.json").read_text())
    del results["provenance"]
    return results, (run_dir / STAGE / "final" / "model.safetensors").read_bytes()


@pytest.mark.slow
def test_killed_in_learned_reward_scst_then_resumed_equals_an_uninterrupted_run(tmp_path):
    clean = tmp_path / "clean"
    _run(_command(clean))
    expected = _outcome(clean / "demo_smoke")

    killed = tmp_path / "killed"
    process = subprocess.Popen(_command(killed), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               env=dict(os.environ, HF_HUB_OFFLINE="1"), start_new_session=True)
    logged = killed / "demo_smoke" / STAGE / "log.csv"  # written after its first optimizer step
    deadline = time.monotonic() + 600
    try:
        while not logged.is_file():
            assert process.poll() is None, process.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, f"{STAGE} logged no step"
            time.sleep(0.02)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    record = json.loads((killed / "demo_smoke" / "stages" / f"{STAGE}.json").read_text())
    assert record["status"] == "running"
    _run(_command(killed))
    assert _outcome(killed / "demo_smoke") == expected

    _run(_command(clean, "--force", STAGE))  # from scratch in a process where the earlier stages were skipped
    assert _outcome(clean / "demo_smoke") == expected
