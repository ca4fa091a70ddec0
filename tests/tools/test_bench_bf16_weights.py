"""bench/bench_bf16_weights.py at toy size, so the benchmark cannot rot (ratios are printed, not asserted)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run(*flags: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, str(REPO / "bench" / "bench_bf16_weights.py"), *flags],
                          capture_output=True, text=True, env=env, timeout=300, check=False)


def test_the_table_at_toy_size_and_a_bad_flag() -> None:
    done = _run("--model", "tiny", "--images", "4", "--repeats", "1", "--threads", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = dict(re.findall(r"^(autocast|cast) +[\d.]+ +[\d.]+x +(\d+)$", done.stdout, re.MULTILINE))
    assert set(rows) == {"autocast", "cast"} and int(rows["cast"]) < int(rows["autocast"])  # fewer copies per call
    assert "max |score(cast) - score(autocast)| = 0\n" in done.stdout  # the same values autocast makes
    bad = _run("--images", "0")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--images" in bad.stderr
