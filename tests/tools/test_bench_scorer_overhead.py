"""bench/bench_scorer_overhead.py at toy sizes, against a second tree (this one), so the benchmark cannot rot."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_table_and_the_stage_split_at_toy_sizes(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, str(REPO / "bench" / "bench_scorer_overhead.py"), "--before", str(REPO),
                           "--images", "6", "--batch", "4", "--workers", "2", "--repeats", "1",
                           "--work", str(tmp_path / "work"), "--json", str(out)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    rows = results["rows"]
    assert [(row["input"], row["dtype"]) for row in rows] == [
        (kind, dtype) for kind in ("JPEG paths", "PIL images (decoded)", "preprocessed tensors")
        for dtype in ("fp32", "bf16")]
    for row in rows:  # 6 images x 5 captions; every rate measured in both trees, the ratios are of those rates
        assert row["pairs"] == 30
        for tree in ("this tree", "before"):
            assert row[f"{tree}: Scorer pairs/s"] > 0 and row[f"{tree}: towers pairs/s"] > 0
            assert row[f"{tree}: Scorer / towers %"] == pytest.approx(
                100 * row[f"{tree}: Scorer pairs/s"] / row[f"{tree}: towers pairs/s"])
        assert row["Scorer this tree / before"] == pytest.approx(
            row["this tree: Scorer pairs/s"] / row["before: Scorer pairs/s"])
    split = results["splits"]["this tree"]
    stages = [row["stage"] for row in split]
    assert "(a) image keys" in stages and stages[-2] == "whole Scorer.score call"
    whole = split[-2]["ms"]
    assert sum(row["ms"] for row in split[:-2]) == pytest.approx(whole)  # the stages and the rest add up
    assert "| input | dtype | pairs |" in done.stdout


@pytest.mark.slow
def test_the_simulated_device_mode_at_toy_size(tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, str(REPO / "bench" / "bench_scorer_overhead.py"), "--before", str(REPO),
                           "--images", "6", "--batch", "4", "--workers", "2", "--repeats", "1", "--sim-device", "3",
                           "--work", str(tmp_path / "work"), "--json", str(out)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [row["tree"] for row in rows] == ["this tree", "before", "this tree / before: Scorer time"]
    for row in rows[:2]:  # 6 images in 2 batches + 30 distinct captions in 8 batches; ratios of the printed times
        assert row["pairs"] == 30 and row["tower batches"] == 10 and row["ms per batch"] == 3
        assert row["towers s"] >= 10 * 0.003  # ten sleeps of 3 ms at least
        assert row["Scorer / max(decode, towers)"] == pytest.approx(
            row["scorer s"] / max(row["decode s"], row["towers s"]))
    assert rows[2]["scorer s"] == pytest.approx(rows[0]["scorer s"] / rows[1]["scorer s"])
    assert "| tree | pairs | tower batches |" in done.stdout


@pytest.mark.parametrize("flags, named", [(["--sim-device", "0"], "--sim-device '0'"),
                                          (["--sim-device", "-2"], "--sim-device '-2'"),
                                          (["--workers", "two"], "--workers 'two'"),
                                          (["--workers", "-1"], "--workers -1")])
def test_bad_flags_are_one_line_and_exit_2(flags: list[str], named: str, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(REPO / "bench" / "bench_scorer_overhead.py"), *flags],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and named in done.stderr and not done.stdout


def test_before_runs_the_other_trees_code(tmp_path: Path) -> None:
    """The editable install maps pacs.metric to this checkout whatever PYTHONPATH says: the child must not."""
    sys.path.insert(0, str(REPO / "bench"))
    try:
        from bench_scorer_overhead import import_root
    finally:
        sys.path.remove(str(REPO / "bench"))
    tree = tmp_path / "tree"
    (tree / "pacs").mkdir(parents=True)
    (tree / "pacs" / "__init__.py").write_text("")
    (tree / "metric" / "scoring").mkdir(parents=True)
    (tree / "metric" / "__init__.py").write_text("")
    (tree / "metric" / "scoring" / "__init__.py").write_text("")
    (tree / "metric" / "scoring" / "scorer.py").write_text("WHICH = 'the other tree'\n")
    (tree / "setup.cfg").write_text("[options]\npackage_dir =\n    pacs = pacs\n    pacs.metric = metric\n")
    root = import_root(tree, tmp_path / "work")
    done = subprocess.run([sys.executable, "-c", "import pacs.metric.scoring.scorer as s; print(s.WHICH)"],
                          capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(root)), cwd=tmp_path,
                          timeout=120, check=False)
    assert done.stdout.strip() == "the other tree", done.stderr[-2000:]
