"""A full disk, a read-only or unwritable folder: one stderr line naming the file and the fix, exit 2, no partial
output (issue 21 item 6)."""
from __future__ import annotations

import errno
import importlib
import json
import os
import tempfile
from pathlib import Path

import pytest
import safetensors.torch

from pacs import cli as pacs_cli
from pacs.metric.common.os_errors import describe_os_error, user_error_line


def _failing(code: int):
    def fail(*args, **kwargs):
        where = kwargs.get("dir") or kwargs.get("filename") or (args[1] if len(args) > 1 else "?")
        raise OSError(code, os.strerror(code), str(where))
    return fail


def _minimal_run(root: Path) -> Path:
    run = root / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps({"columns": ["C"], "rows": [{"model": "xe", "C": 1.0}]}))
    return run


@pytest.mark.parametrize("code, fix", [(errno.ENOSPC, "free some disk space"), (errno.EROFS, "read-only"),
                                       (errno.EACCES, "make it accessible")])
def test_report_on_a_full_or_read_only_disk_is_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys, code, fix):
    run = _minimal_run(tmp_path)
    monkeypatch.setattr(tempfile, "mkstemp", _failing(code))
    assert pacs_cli.main(["report", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"pacs report: error: {run}: {os.strerror(code)}; "), err
    assert fix in err[0]
    assert sorted(p.name for p in run.iterdir()) == ["results.json"]


def test_a_full_disk_during_a_stage_stops_with_one_line_and_the_stage_unfinished(tmp_path, monkeypatch, capsys,
                                                                                torch_threads_restored):
    """ENOSPC when the demo's CLIP stage writes its checkpoint: exit 2, the stage is not recorded finished."""
    for module in ("accelerate.utils.other", "pacs.captioner.modeling.checkpoints", "pacs.captioner.modeling.features"):
        importlib.import_module(module)  # they bind `save_file` when imported: the real one, not the fake
    monkeypatch.setattr(safetensors.torch, "save_file", _failing(errno.ENOSPC))
    code = pacs_cli.main(["--log-level", "WARNING", "train", "--config", "demo_smoke", f"runs_dir={tmp_path}",
                          "threads=1"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("pacs train:")]
    assert code == 2 and len(err) == 1, err
    assert "No space left on device; free some disk space" in err[0]
    record = json.loads((tmp_path / "demo_smoke" / "stages" / "clip.json").read_text())
    assert record["status"] == "running" and "output_id" not in record
    assert json.loads((tmp_path / "demo_smoke" / "stages" / "data.json").read_text())["status"] == "finished"


def test_only_failures_the_user_can_fix_become_one_line():
    assert describe_os_error(OSError(errno.ENOSPC, "No space left on device", "/x/y")) == (
        "/x/y: No space left on device; free some disk space (or write to another disk) and run again")
    assert describe_os_error(OSError(errno.ENOSPC, "No space left on device", "/x/y"), resumable=True) == (
        "/x/y: No space left on device; free some disk space (or write to another disk) and run again; finished "
        "work is kept and an interrupted stage resumes or restarts")
    assert describe_os_error(OSError(errno.EIO, "Input/output error", "/x")) is None  # a real fault: traceback
    assert user_error_line(ValueError("bug")) is None
