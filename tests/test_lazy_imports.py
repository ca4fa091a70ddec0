"""`pacs --help`, every sub-command's `--help` and the text-only commands never import the model stack.

Each command runs in a fresh interpreter that prints which heavy packages ended up in `sys.modules`; the
sub-commands are read from the parser, so a new one is covered without editing this file. Seconds are
measured in bench/bench_startup.py, not here.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pacs import cli as pacs_cli

HEAVY = ("open_clip", "torchvision", "transformers")
SHARED = Path(os.environ.get("PACS_SHARED", Path(__file__).resolve().parents[2] / "shared"))

# Runs `pacs.cli.main(argv)` and prints one JSON line: the exit status and the heavy packages imported.
PROBE = """
import contextlib, importlib, io, json, sys
argv, heavy, preload = (json.loads(arg) for arg in sys.argv[1:4])
for name in preload:
    importlib.import_module(name)
from pacs import cli as pacs_cli
with contextlib.redirect_stdout(io.StringIO()):
    try:
        status = pacs_cli.main(argv)
    except SystemExit as exit_:
        status = exit_.code
print(json.dumps({"status": status, "imported": [name for name in heavy if name in sys.modules]}))
"""


def _run(argv: list[str], cwd: Path, preload: tuple[str, ...] = ()) -> dict:
    """Run `pacs argv` in a fresh interpreter (after importing `preload`); the probe's JSON line."""
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv), json.dumps([*HEAVY, "torch"]),
                           json.dumps(list(preload))],
                          cwd=cwd, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _subcommands() -> list[str]:
    """Every sub-command name the `pacs` parser registers."""
    parser = pacs_cli.build_parser()
    (action,) = [a for a in parser._actions if a.dest == "command"]
    return sorted(action.choices)


def test_the_parser_lists_the_known_subcommands() -> None:
    # guards the enumeration below: it must really find the sub-commands
    assert {"score", "correlate", "evaluate", "train", "train-metric", "report", "caption"} <= set(_subcommands())


@pytest.mark.parametrize("argv", [["--help"], *[[name, "--help"] for name in _subcommands()]],
                         ids=lambda argv: " ".join(argv))
def test_help_imports_no_model_stack(argv: list[str], tmp_path: Path) -> None:
    result = _run(argv, tmp_path)
    assert result["status"] == 0
    assert not set(result["imported"]) & set(HEAVY), result


def test_text_only_evaluate_imports_no_model_stack(tmp_path: Path) -> None:
    (tmp_path / "candidates.json").write_text(json.dumps({"1": "a dog runs on the grass", "2": "two cats sleep"}))
    (tmp_path / "references.json").write_text(json.dumps({"1": ["a dog running on grass", "the dog runs"],
                                                          "2": ["two cats are sleeping", "cats asleep on a bed"]}))
    result = _run(["evaluate", "--candidates", "candidates.json", "--references", "references.json",
                   "--metrics", "bleu1,cider,rep1,length", "--out", "table.json"], tmp_path)
    assert result["status"] == 0
    table = json.loads((tmp_path / "table.json").read_text())["metrics"]
    # the command really ran: length is the mean word count (6 and 3 words)
    assert table["length"] == pytest.approx(4.5) and set(table) == {"bleu1", "cider", "rep1", "length"}
    assert not set(result["imported"]) & set(HEAVY), result


@pytest.mark.skipif(not (SHARED / "data" / "flickr8k").is_dir(), reason="shared Flickr8k data not present")
def test_text_only_correlate_imports_no_model_stack(tmp_path: Path) -> None:
    result = _run(["correlate", "flickr8k-expert", "--data", str(SHARED / "data" / "flickr8k"),
                   "--metrics", "bleu1,cider", "--out", "expert.json"], tmp_path)
    assert result["status"] == 0
    table = json.loads((tmp_path / "expert.json").read_text())
    assert {"bleu1", "cider"} <= set(table)
    assert not set(result["imported"]) & set(HEAVY), result


def test_the_probe_sees_the_model_stack(tmp_path: Path) -> None:
    # the probe can fail: with the backbone module imported first, `pacs --help` reports open_clip and torch
    result = _run(["--help"], tmp_path, preload=("pacs.metric.models.backbones",))
    assert result["status"] == 0
    assert {"open_clip", "torch"} <= set(result["imported"]), result
