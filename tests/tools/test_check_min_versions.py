"""The pure parts of tools/check_min_versions.py: candidate choice, bisection, setup.cfg parsing."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from packaging.version import Version

TOOL = Path(__file__).resolve().parents[2] / "tools" / "check_min_versions.py"


@pytest.fixture(scope="module")
def tool():
    """The script loaded as a module (tools/ is not a package)."""
    spec = importlib.util.spec_from_file_location("check_min_versions", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def test_first_release_of_each_minor_between_floor_and_installed(tool):
    versions = [Version(v) for v in ("2.23.0", "2.24.0", "2.24.1", "2.26.1", "2.27.0", "2.27.1", "3.0.0")]
    picked = tool.first_of_each_minor(versions, Version("2.24"), Version("2.27.1"))
    # by hand: 2.23 is under the floor, 3.0.0 above the installed release; 2.24.0 / 2.26.1 / 2.27.0 open their minors
    assert [str(v) for v in picked] == ["2.24.0", "2.26.1", "2.27.0"]


@pytest.mark.parametrize("boundary", [0, 1, 6, 9])
def test_bisection_finds_the_boundary_and_tries_the_release_just_below(tool, boundary):
    candidates = [f"1.{i}.0" for i in range(10)]
    calls = []

    def passes(version):
        calls.append(version)
        return tool.Outcome(version, int(version.split(".")[1]) >= boundary)

    index, tried = tool.bisect_oldest(candidates, passes)
    assert index == boundary
    assert len(calls) <= 4  # ceil(log2(10)); a linear scan would need up to 9
    assert "1.9.0" not in calls  # the installed (newest) release is known to pass, never re-installed
    if boundary > 0:
        below = [o for o in tried if o.version == candidates[boundary - 1]]
        assert below and not below[0].passed


def test_declared_requirements_reads_install_requires_with_comments(tool, tmp_path):
    cfg = tmp_path / "setup.cfg"
    cfg.write_text("[options]\ninstall_requires =\n    torch>=2.1\n    open_clip_torch>=2.24  # why\n"
                   "    Pillow\n    # a comment line\n    ftfy>=6.0\n")
    declared = tool.declared_requirements(cfg)
    assert list(declared) == ["torch", "open-clip-torch", "pillow", "ftfy"]
    assert str(declared["open-clip-torch"].specifier) == ">=2.24"
    assert str(declared["pillow"].specifier) == ""


def test_failure_line_prefers_the_first_error(tool):
    output = ("....F\n=================================== FAILURES ===\n"
              "E       ImportError: cannot import name 'x' from 'open_clip'\nE   more\n"
              "=========================== 1 failed, 4 passed in 2.00s ===\n")
    assert tool.failure_line(output) == ("ImportError: cannot import name 'x' from 'open_clip' "
                                         "[1 failed, 4 passed in 2.00s]")


def test_skipped_count_reads_the_summary_line(tool):
    assert tool.skipped_count("===== 3 passed, 2 skipped, 1 warning in 1.00s =====") == 2
    assert tool.skipped_count("===== 3 passed in 1.00s =====") == 0
