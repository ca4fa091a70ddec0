"""The demo's run folder is `run_dir`, as a recipe's (issue 40 item 2); 0.6's `name` / `runs_dir` keep working for
one release, each with one deprecation line that says what to write instead."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest

from pacs.captioner.demo.pipeline import REPO_CONFIGS, load_demo_config

SMOKE = REPO_CONFIGS / "demo_smoke.yaml"


@pytest.mark.parametrize(("overrides", "expected", "deprecated"), [
    ([], Path("runs/demo_smoke"), None),
    (["run_dir=/tmp/mine"], Path("/tmp/mine"), None),
    (["runs_dir=/tmp/x"], Path("/tmp/x/demo_smoke"), "runs_dir"),
    (["name=other"], Path("runs/other"), "name"),
    (["runs_dir=/tmp/x", "name=other"], Path("/tmp/x/other"), "name and runs_dir"),
    (["run_dir=/tmp/mine/run", "runs_dir=/tmp/x"], Path("/tmp/x/run"), "runs_dir"),
])
def test_the_run_folder_and_the_deprecated_keys(overrides, expected, deprecated, caplog):
    with caplog.at_level(logging.WARNING, logger="pacs.captioner.demo.config"):
        config = load_demo_config(SMOKE, overrides)
    assert config.run_path() == expected
    lines = [r.getMessage() for r in caplog.records if r.name == "pacs.captioner.demo.config"]
    if deprecated is None:
        assert lines == []
    else:
        assert f"demo: {deprecated} are deprecated since 0.7 and go in 0.8: write run_dir={expected} instead" in lines


def test_the_embedded_default_writes_to_runs_demo():
    assert load_demo_config(None, []).run_path() == Path("runs/demo")
