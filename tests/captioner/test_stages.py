"""The stage mechanism (captioner/orchestration/stages.py): skip, re-run with a log line, downstream, inputs, resume, refuse,
force."""
from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import pytest

from pacs.captioner.orchestration.stages import StageRunner, check_force, file_input, fingerprint_changes
from pacs.metric.common.errors import InputError


class Chain:
    """Three stages a -> b -> c; a reads an annotation file, b a checkpoint; bodies count their calls.

    `resumable`: b and c resume from their folders when interrupted (as XE and SCST do).
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.annotations = root / "captions.json"
        self.annotations.write_text('{"images": []}')
        self.weights = root / "weights.bin"
        self.weights.write_bytes(b"\x00" * 64)
        self.calls: list[str] = []

    def body(self, runner: StageRunner, name: str):
        def run():
            self.calls.append(name)
            (runner.folder(name) / "out.txt").write_text(name)
            return {"name": name}
        return run

    def run(self, lr: float = 1e-3, force: tuple[str, ...] = (), resumable: bool = False) -> StageRunner:
        runner = StageRunner(self.root / "run", force)
        runner.run("a", self.body(runner, "a"), {"a": {"size": 3}}, {"data": file_input(self.annotations)})
        runner.run("b", self.body(runner, "b"), {"b": {"lr": lr}}, {"init": runner.checkpoint(self.weights)},
                   upstream=["a"], resumable=resumable)
        runner.run("c", self.body(runner, "c"), {"c": {"beam": 2}}, upstream=["b"], resumable=resumable)
        return runner


def test_unchanged_stages_are_skipped(tmp_path):
    chain = Chain(tmp_path)
    first = chain.run()
    assert first.ran == ["a", "b", "c"] and chain.calls == ["a", "b", "c"]
    second = chain.run()
    assert second.skipped == ["a", "b", "c"] and second.ran == [] and chain.calls == ["a", "b", "c"]
    record = json.loads((tmp_path / "run" / "stages" / "b.json").read_text())
    assert record["status"] == "finished" and record["settings"] == {"b": {"lr": 1e-3}}
    assert record["upstream"] == {"a": first.ids["a"]} and record["summary"] == {"name": "b"}


def test_changed_setting_reruns_the_stage_and_downstream_with_one_log_line(tmp_path, caplog):
    chain = Chain(tmp_path)
    chain.run(lr=5e-6)
    (tmp_path / "run" / "b" / "stale.txt").write_text("from the old settings")
    chain.calls.clear()
    with caplog.at_level(logging.INFO, logger="pacs.captioner.orchestration.stages"):
        runner = chain.run(lr=1e-6)
    assert chain.calls == ["b", "c"] and runner.skipped == ["a"]
    assert "stage b: re-running: b.lr 5e-06 -> 1e-06" in caplog.messages
    assert "stage c: re-running: upstream b re-ran" in caplog.messages
    assert not (tmp_path / "run" / "b" / "stale.txt").exists()  # a re-run starts from an empty folder


def test_changed_annotation_file_size_or_mtime_reruns(tmp_path, caplog):
    chain = Chain(tmp_path)
    chain.run()
    chain.calls.clear()
    os.utime(chain.annotations, ns=(1_000_000_000, 1_000_000_000))  # same content, other mtime
    with caplog.at_level(logging.INFO, logger="pacs.captioner.orchestration.stages"):
        chain.run()
    assert chain.calls == ["a", "b", "c"]
    line = next(m for m in caplog.messages if m.startswith("stage a: re-running"))
    assert "input data.mtime_ns" in line and "-> 1000000000" in line
    chain.calls.clear()
    chain.annotations.write_text('{"images": [1]}')
    chain.run()
    assert chain.calls == ["a", "b", "c"]


def test_changed_checkpoint_content_reruns_and_hash_is_cached(tmp_path, caplog):
    chain = Chain(tmp_path)
    chain.run()
    cache = json.loads((tmp_path / "run" / "stages" / "hashes.json").read_text())
    assert cache[str(chain.weights.resolve())]["sha256"] == hashlib.sha256(b"\x00" * 64).hexdigest()
    chain.calls.clear()
    stat = chain.weights.stat()
    chain.weights.write_bytes(b"\x01" * 64)  # same size; the mtime is restored, so only a re-hash can tell ...
    os.utime(chain.weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    chain.run()
    assert chain.calls == []  # ... and the cache (same path, size, mtime) is trusted: no re-hash
    os.utime(chain.weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    with caplog.at_level(logging.INFO, logger="pacs.captioner.orchestration.stages"):
        chain.run()
    assert chain.calls == ["b", "c"]
    old, new = hashlib.sha256(bytes(64)).hexdigest(), hashlib.sha256(b"\x01" * 64).hexdigest()
    line = next(m for m in caplog.messages if m.startswith("stage b: re-running"))
    assert line.startswith(f"stage b: re-running: input init.sha256 {old[:40]}") and f"-> {new[:40]}" in line


def _interrupt(runner_root: Path, name: str) -> None:
    """Mark a finished stage as interrupted (what a killed run leaves: a record with status running)."""
    path = runner_root / "stages" / f"{name}.json"
    record = json.loads(path.read_text())
    record["status"] = "running"
    record.pop("output_id")
    path.write_text(json.dumps(record))


def test_interrupted_stage_with_the_same_fingerprint_resumes_in_place(tmp_path):
    chain = Chain(tmp_path)
    chain.run(resumable=True)
    _interrupt(tmp_path / "run", "c")
    (tmp_path / "run" / "c" / "checkpoint-3").write_text("kept")
    chain.calls.clear()
    runner = chain.run(resumable=True)
    assert chain.calls == ["c"] and runner.resumed == ["c"] and runner.skipped == ["a", "b"]
    assert (tmp_path / "run" / "c" / "checkpoint-3").read_text() == "kept"  # its checkpoints are not deleted
    assert json.loads((tmp_path / "run" / "stages" / "c.json").read_text())["status"] == "finished"


def test_interrupted_stage_with_other_settings_is_refused_then_forced(tmp_path):
    chain = Chain(tmp_path)
    chain.run(resumable=True)
    _interrupt(tmp_path / "run", "b")
    path = tmp_path / "run" / "stages" / "b.json"
    record = json.loads(path.read_text())
    path.write_text(json.dumps(dict(record, settings={"b": {"lr": 0.5}}, fingerprint="0" * 16)))
    (tmp_path / "run" / "b" / "checkpoint-3").write_text("trained with lr 0.5")
    chain.calls.clear()
    with pytest.raises(InputError, match=r"stage b was interrupted under other settings .*b\.lr 0\.5 -> 0\.001.*"
                                         r"--force b"):
        chain.run(resumable=True)
    assert chain.calls == [] and (tmp_path / "run" / "b" / "checkpoint-3").is_file()
    runner = chain.run(force=("b",), resumable=True)
    assert chain.calls == ["b", "c"] and runner.skipped == ["a"]
    assert not (tmp_path / "run" / "b" / "checkpoint-3").exists()


def test_force_reruns_one_stage_and_everything_below(tmp_path):
    chain = Chain(tmp_path)
    chain.run()
    chain.calls.clear()
    runner = chain.run(force=("b",))
    assert chain.calls == ["b", "c"] and runner.skipped == ["a"]
    chain.calls.clear()
    chain.run()
    assert chain.calls == []  # forcing is not sticky


def test_output_without_a_record_is_refused_for_resumable_stages(tmp_path):
    runner = StageRunner(tmp_path / "run")
    (tmp_path / "run" / "xe" / "checkpoints").mkdir(parents=True)
    with pytest.raises(InputError, match=r"stage xe: .*xe holds output but no stage record.*--force xe"):
        runner.run("xe", lambda: None, {"lr": 1}, resumable=True)
    # below a stage that re-ran in this run, such output is certainly stale: it starts over
    runner.run("vocab", lambda: None, {"size": 1})
    runner.run("xe", lambda: None, {"lr": 1}, upstream=["vocab"], resumable=True)
    assert runner.ran == ["vocab", "xe"] and not (tmp_path / "run" / "xe" / "checkpoints").exists()


def test_unknown_force_name_lists_the_stages():
    stages = ["vocab", "features/train", "xe", "eval/xe/coco"]
    check_force(["eval", "features/train", "xe"], stages)
    with pytest.raises(InputError, match="force= scst: no such stage; the stages of this run are: vocab, "
                                         "features/train, xe, eval/xe/coco"):
        check_force(["scst"], stages)


def test_fingerprint_changes_reads_nested_settings_and_inputs():
    old = {"settings": {"scst": {"lr": 5e-6, "k": 5}}, "inputs": {"data": {"size": 10}}, "upstream": {"xe": "1"}}
    new = {"settings": {"scst": {"lr": 1e-6, "k": 5}}, "inputs": {"data": {"size": 12}}, "upstream": {"xe": "2"}}
    assert fingerprint_changes(old, new) == ["scst.lr 5e-06 -> 1e-06", "input data.size 10 -> 12",
                                             "upstream xe re-ran"]


def test_interrupted_stage_below_a_rerun_stage_starts_over_instead_of_refusing(tmp_path, caplog):
    chain = Chain(tmp_path)
    chain.run(lr=5e-6, resumable=True)
    _interrupt(tmp_path / "run", "c")
    (tmp_path / "run" / "c" / "checkpoint-3").write_text("trained on the old b")
    chain.calls.clear()
    with caplog.at_level(logging.INFO, logger="pacs.captioner.orchestration.stages"):
        runner = chain.run(lr=1e-6, resumable=True)  # b changed (finished: re-runs), so c's checkpoints are void
    assert chain.calls == ["b", "c"] and runner.ran == ["b", "c"] and runner.resumed == []
    assert "stage c: interrupted, re-running from scratch: upstream b re-ran" in caplog.messages
    assert not (tmp_path / "run" / "c" / "checkpoint-3").exists()


def test_micro_batch_is_derived_from_the_process_count_unless_fixed():
    from pacs.captioner.modeling.training_setup import micro_batch_for

    assert micro_batch_for(32, 0, 2, "demo.xe") == 16 and micro_batch_for(32, None, 1, "demo.xe") == 32
    assert micro_batch_for(32, 8, 2, "xe") == 8  # fixed: kept (2 accumulation steps per process)
    with pytest.raises(InputError, match="demo.scst: batch_size=9 cannot be split evenly over 2 processes"):
        micro_batch_for(9, 0, 2, "demo.scst")
    with pytest.raises(InputError, match=r"xe: batch_size=32 must be a multiple of micro_batch_size \(32\) × "
                                         r"processes \(2\) = 64"):
        micro_batch_for(32, 32, 2, "xe")
