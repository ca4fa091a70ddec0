"""docs/dropin.md: every code block equals the file or function it shows, and every run prints what the page shows."""
from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "dropin.md"
BLOCK = re.compile(r"<!-- (file|function|command|output)(?:: (\S+))? -->\n```(\w+)\n(.*?)\n```", re.DOTALL)
NUMBER = re.compile(r"-?\d+\.\d+|-?\d+")


def page_blocks() -> list[tuple[str, str | None, str]]:
    """(kind, argument, code) of each marked block of the page, in page order."""
    return [(kind, arg, code) for kind, arg, _, code in BLOCK.findall(PAGE.read_text())]


def runs() -> list[tuple[str, str]]:
    """(what to run, the output the page shows): each file or command block followed by an output block."""
    blocks, pairs = page_blocks(), []
    for (kind, arg, code), following in zip(blocks, blocks[1:] + [("", None, "")]):
        if kind in ("file", "command") and following[0] == "output":
            pairs.append((arg if kind == "file" else code, following[2]))
    return pairs


def function_source(spec: str) -> str:
    """The source text of `PATH::NAME` (a top-level function or class), read without importing the file."""
    path, name = spec.split("::")
    source = (ROOT / path).read_text()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            return ast.get_source_segment(source, node)
    raise AssertionError(f"{spec}: no top-level function or class {name}")


def test_code_blocks_equal_their_sources():
    blocks = page_blocks()
    kinds = [kind for kind, _, _ in blocks]
    assert kinds.count("file") == 3 and kinds.count("function") == 2 and kinds.count("command") == 2
    for kind, arg, code in blocks:
        if kind == "file":
            assert code == (ROOT / arg).read_text().rstrip("\n"), f"docs/dropin.md block differs from {arg}"
        elif kind == "function":
            assert code == function_source(arg), f"docs/dropin.md block differs from {arg}"
    assert len(runs()) == 5  # 3 example files + 2 recipe commands, each with its printed output


def test_readme_links_the_page():
    assert "(docs/dropin.md)" in (ROOT / "README.md").read_text()


def same_output(actual: str, shown: str, atol: float = 2e-3) -> bool:
    """Equal line by line, numbers within `atol` (another CPU may change the last digit)."""
    actual_lines, shown_lines = actual.rstrip("\n").splitlines(), shown.splitlines()
    if len(actual_lines) != len(shown_lines):
        return False
    for got, want in zip(actual_lines, shown_lines):
        if NUMBER.sub("#", got) != NUMBER.sub("#", want):
            return False
        if any(abs(float(a) - float(b)) > atol for a, b in zip(NUMBER.findall(got), NUMBER.findall(want))):
            return False
    return True


def test_same_output_compares_numbers_within_tolerance():
    assert same_output("step 1: reward 0.2449\n", "step 1: reward 0.2450")
    assert not same_output("step 1: reward 0.2549", "step 1: reward 0.2450")
    assert not same_output("step 1: loss 0.2450", "step 1: reward 0.2450")
    assert not same_output("a\nb", "a")


@pytest.mark.slow
@pytest.mark.parametrize("target,shown", runs(), ids=[target.split()[-1] if target.endswith(".py") else
                                                      target.split()[1] for target, _ in runs()])
def test_each_example_prints_what_the_page_shows(target, shown, shared):
    argv = [sys.executable, target] if target.endswith(".py") and " " not in target else shlex.split(target)
    if argv[0] == "python":
        argv[0] = sys.executable
    env = dict(os.environ, PACS_SHARED=str(shared), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_DATASETS_OFFLINE="1")
    proc = subprocess.run(argv, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert same_output(proc.stdout, shown), f"{target} printed:\n{proc.stdout}\nthe page shows:\n{shown}"
