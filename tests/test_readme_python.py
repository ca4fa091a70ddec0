"""Every ```python block of README.md runs as written: a fresh interpreter each, in an empty folder, PACS_SHARED set.

The blocks build what they need (the tiny random backbone, the shared fixtures and data); a block that refers to
a name it does not define, reads a file that is not there or needs a download fails here.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
_BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(line number of the opening fence, code) of every ```python block."""
    return [(text.count("\n", 0, match.start()) + 1, match.group(1)) for match in _BLOCK.finditer(text)]


BLOCKS = python_blocks(README.read_text(encoding="utf-8"))


def test_the_extraction_finds_every_python_fence():
    text = README.read_text(encoding="utf-8")
    assert len(BLOCKS) == text.count("```python") >= 6
    assert python_blocks("x\n```python\na = 1\n```\n```bash\nls\n```\n```python\nb = 2\n```\n") == [
        (2, "a = 1\n"), (8, "b = 2\n")]


def test_no_block_imports_eval_as_a_module():
    """`import eval` shadows Python's built-in `eval`: the README writes `from eval import ...`."""
    offending = [line for line, code in BLOCKS if re.search(r"^\s*import eval\b", code, re.MULTILINE)]
    assert offending == []


@pytest.mark.parametrize("line, code", BLOCKS, ids=[f"README.md:{line}" for line, _ in BLOCKS])
def test_readme_python_block_runs_as_written(line, code, shared, tmp_path):
    env = {**os.environ, "PACS_SHARED": str(shared), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=600, check=False)
    assert result.returncode == 0, f"README.md:{line} failed:\n{code}\n--- stderr ---\n{result.stderr[-4000:]}"
