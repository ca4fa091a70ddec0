"""A finished stage is reused only when its outputs are exactly what it made (issue 21 item 2), and a broken stage
record is re-run, not a raw exception."""
from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import pytest

from pacs.captioner.orchestration import stage_outputs
from pacs.captioner.orchestration.stages import StageRunner


class TwoStages:
    """`make` writes a weights file and a folder of shards; `use` reads them. Bodies count their calls."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.calls: list[str] = []

    def run(self) -> StageRunner:
        runner = StageRunner(self.root / "run")

        def make() -> None:
            self.calls.append("make")
            folder = runner.folder("make")
            (folder / "weights.bin").write_bytes(bytes(range(256)) * 64)
            (folder / "shards").mkdir()
            for index in range(3):
                (folder / "shards" / f"{index}.bin").write_bytes(bytes([index]) * 1000)

        def use() -> None:
            self.calls.append("use")
            (runner.folder("use") / "out.txt").write_text("ok")

        runner.run("make", make, {"size": 3})
        runner.run("use", use, {}, upstream=["make"])
        return runner

    @property
    def weights(self) -> Path:
        return self.root / "run" / "make" / "weights.bin"


@pytest.fixture
def chain(tmp_path: Path) -> TwoStages:
    chain = TwoStages(tmp_path)
    chain.run()
    assert chain.calls == ["make", "use"]
    return chain


def _damage_cases():
    def truncate(chain):
        chain.weights.write_bytes(chain.weights.read_bytes()[:100])

    def delete(chain):
        chain.weights.unlink()

    def same_size_other_bytes(chain):
        data = bytearray(chain.weights.read_bytes())
        data[5000] ^= 0xFF
        stat = chain.weights.stat()
        chain.weights.write_bytes(bytes(data))
        os.utime(chain.weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # even the mtime is as before

    def delete_a_shard(chain):
        (chain.weights.parent / "shards" / "1.bin").unlink()

    def add_a_file(chain):
        (chain.weights.parent / "shards" / "extra.bin").write_bytes(b"x")

    def replace_by_a_link(chain):
        target = chain.root / "elsewhere.bin"
        target.write_bytes(chain.weights.read_bytes())
        chain.weights.unlink()
        chain.weights.symlink_to(target)

    return {"truncated": (truncate, "changed size (16384 -> 100 bytes)"), "deleted": (delete, "is missing"),
            "rewritten": (same_size_other_bytes, "changed content"),
            "shard deleted": (delete_a_shard, "make/shards/1.bin is missing"),
            "file added": (add_a_file, "make/shards/extra.bin was added"),
            "linked": (replace_by_a_link, "no longer a regular file")}


@pytest.mark.parametrize("case", sorted(_damage_cases()))
def test_a_changed_output_reruns_its_stage_and_everything_below(chain, case, caplog):
    damage, reason = _damage_cases()[case]
    damage(chain)
    with caplog.at_level(logging.INFO, logger="pacs.captioner.orchestration.stages"):
        runner = chain.run()
    assert chain.calls == ["make", "use", "make", "use"]
    assert runner.ran == ["make", "use"]
    lines = [r.getMessage() for r in caplog.records if "outputs are not as it made them" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("stage make: re-running") and reason in lines[0], lines
    assert chain.weights.read_bytes() == bytes(range(256)) * 64 and not chain.weights.is_symlink()
    assert chain.run().skipped == ["make", "use"]  # rebuilt and recorded: reused next time


def test_unchanged_outputs_are_reused_and_recorded_with_their_digests(chain):
    runner = chain.run()
    assert runner.skipped == ["make", "use"] and chain.calls == ["make", "use"]
    record = json.loads((chain.root / "run" / "stages" / "make.json").read_text())
    expected = "full:" + hashlib.sha256(bytes(range(256)) * 64).hexdigest()
    assert record["outputs"]["make"]["weights.bin"] == {"size": 16384, "digest": expected}
    assert sorted(record["outputs"]["make"]) == ["shards/0.bin", "shards/1.bin", "shards/2.bin", "weights.bin"]


@pytest.mark.parametrize("content", [b"5", b"\xff\xfe not utf-8", b"[1, 2]", b"{", b"[" * 100000])
def test_an_unreadable_stage_record_reruns_the_stage(chain, content, caplog):
    (chain.root / "run" / "stages" / "make.json").write_bytes(content)
    with caplog.at_level(logging.INFO, logger="pacs.captioner.orchestration.stages"):
        runner = chain.run()
    assert runner.ran == ["make", "use"]
    assert any("make.json is unreadable, re-running" in r.getMessage() for r in caplog.records)


def test_a_record_without_an_output_list_reruns(chain, caplog):
    """Stages finished by pacs 0.3 recorded no outputs: they cannot be verified, so they run again once."""
    path = chain.root / "run" / "stages" / "make.json"
    record = json.loads(path.read_text())
    del record["outputs"]
    path.write_text(json.dumps(record))
    with caplog.at_level(logging.INFO, logger="pacs.captioner.orchestration.stages"):
        assert chain.run().ran == ["make", "use"]
    assert any("no record of its outputs" in r.getMessage() for r in caplog.records)


def test_large_files_get_a_sampled_digest_that_sees_a_change_in_the_middle(tmp_path, monkeypatch):
    monkeypatch.setattr(stage_outputs, "FULL_HASH_BYTES", 4 * 1024 * 1024)
    big = tmp_path / "big.bin"
    data = bytearray(os.urandom(8 * 1024 * 1024))
    big.write_bytes(bytes(data))
    before = stage_outputs.file_digest(big, len(data))
    assert before.startswith("sampled:")
    # one byte inside a sampled block (block i starts at (size - 64 KiB) * i / 31)
    offset = (len(data) - 64 * 1024) * 15 // 31 + 10
    data[offset] ^= 1
    big.write_bytes(bytes(data))
    assert stage_outputs.file_digest(big, len(data)) != before


@pytest.mark.parametrize("content", [b"\xff\xfe", b"5", b'{"x": 5}', b'{"/a": {"size": 1}}', b"[" * 100000])
def test_an_unreadable_hash_cache_is_an_empty_one(tmp_path, content):
    """stages/hashes.json only saves re-hashing: whatever it holds, checkpoints are hashed again, never a crash."""
    from pacs.captioner.orchestration.stages import HashCache

    weights = tmp_path / "w.bin"
    weights.write_bytes(b"weights")
    (tmp_path / "hashes.json").write_bytes(content)
    cache = HashCache(tmp_path / "hashes.json", writer=True)
    assert cache.file_sha256(weights) == hashlib.sha256(b"weights").hexdigest()
