"""Every ```python block of README.md and of every docs/*.md page runs as written.

Each block runs in a fresh interpreter, in an empty folder, with PACS_SHARED set and the Hugging Face hub offline.
The blocks build what they need (the tiny random backbone, the shared fixtures and data); a block that refers to a
name it does not define, imports a name from a module that lacks it, reads a file that is not there or needs a
download fails here. The comment on the line just before a block's fence may mark it:

- ``<!-- not-run: REASON -->``: it cannot run offline here (real pretrained weights, a GPU); such a block is
  skipped with its reason, so ``pytest -ra`` lists every one, and ``test_the_markers_are_well_formed`` counts them;
- ``<!-- file: PATH -->`` / ``<!-- function: PATH::NAME -->``: the block is that file or function, checked equal
  to it here; tests/test_dropin_docs.py runs the file (or the recipe holding the function).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_dropin_docs import function_source
from test_dropin_docs import runs as dropin_runs

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
_BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)
_MARKER = re.compile(r"^<!--\s*(not-run|file|function):\s*(.*?)\s*-->$")
_ANY_MARKER = re.compile(r"<!--\s*not-run\b")


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(line number of the opening fence, code) of every ```python block."""
    return [(text.count("\n", 0, match.start()) + 1, match.group(1)) for match in _BLOCK.finditer(text)]


def marked_blocks(text: str) -> list[tuple[int, str, str | None, str]]:
    """(line, code, marker kind or None, marker argument) of every ```python block; the marker is the comment on
    the last non-blank line before the fence."""
    found = []
    for match in _BLOCK.finditer(text):
        before = text[:match.start()].rstrip().splitlines()
        marker = _MARKER.match(before[-1].strip()) if before else None
        found.append((text.count("\n", 0, match.start()) + 1, match.group(1),
                      marker.group(1) if marker else None, marker.group(2) if marker else ""))
    return found


def _page_blocks(pages: list[Path]) -> list[tuple[str, str, str | None, str]]:
    return [(f"{page.relative_to(ROOT)}:{line}", code, kind, argument)
            for page in pages for line, code, kind, argument in marked_blocks(page.read_text(encoding="utf-8"))]


BLOCKS = python_blocks(README.read_text(encoding="utf-8"))
DOC_BLOCKS = _page_blocks(DOCS)
RUN = [(where, code, kind, argument) for where, code, kind, argument in DOC_BLOCKS if kind in (None, "not-run")]
SOURCED = [(where, code, kind, argument) for where, code, kind, argument in DOC_BLOCKS if kind in ("file", "function")]


def run_block(code: str, where: str, shared: Path, folder: Path) -> None:
    """Run one block in a fresh interpreter in `folder`; fail with its stderr."""
    env = {**os.environ, "PACS_SHARED": str(shared), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", code], cwd=folder, env=env, capture_output=True, text=True,
                            timeout=600, check=False)
    assert result.returncode == 0, f"{where} failed:\n{code}\n--- stderr ---\n{result.stderr[-4000:]}"


def test_the_extraction_finds_every_python_fence():
    text = README.read_text(encoding="utf-8")
    assert len(BLOCKS) == text.count("```python") >= 1
    assert python_blocks("x\n```python\na = 1\n```\n```bash\nls\n```\n```python\nb = 2\n```\n") == [
        (2, "a = 1\n"), (8, "b = 2\n")]
    assert len(DOC_BLOCKS) == sum(page.read_text(encoding="utf-8").count("```python") for page in DOCS) >= 10


def test_markers_are_read_from_the_line_before_the_fence():
    text = ("a\n<!-- not-run: needs pretrained weights -->\n```python\nx = 1\n```\n\n"
            "<!-- file: docs/examples/a.py -->\n\n```python\ny = 2\n```\n"
            "<!-- not-run: stale -->\nprose in between\n```python\nz = 3\n```\n")
    assert marked_blocks(text) == [(3, "x = 1\n", "not-run", "needs pretrained weights"),
                                   (9, "y = 2\n", "file", "docs/examples/a.py"), (14, "z = 3\n", None, "")]


def test_no_block_imports_a_top_level_name_pacs_does_not_install():
    """pacs installs one namespace: the docs import `pacs.metric`, `pacs.eval`, ..., never `metric` or `eval`."""
    everything = [(f"README.md:{line}", code) for line, code in BLOCKS] + [(w, c) for w, c, _, _ in DOC_BLOCKS]
    old = r"^\s*(import|from) (captioner|eval|metric|rewards|pacs_cli|pacs_configs)\b"
    offending = [where for where, code in everything if re.search(old, code, re.MULTILINE)]
    assert offending == []


def test_the_markers_are_well_formed():
    """Every not-run marker sits right before a python block and says why; the count is reported."""
    pages = [README, *DOCS]
    written = sum(len(_ANY_MARKER.findall(page.read_text(encoding="utf-8"))) for page in pages)
    not_run = [(where, reason) for where, _, kind, reason in _page_blocks(pages) if kind == "not-run"]
    assert written == len(not_run), "a `not-run` marker that is not on the line before a ```python fence"
    assert all(reason for _, reason in not_run), not_run
    print(f"{len(not_run)} python block(s) not run here: " + "; ".join(f"{w} ({r})" for w, r in not_run))


@pytest.mark.parametrize("line, code", BLOCKS, ids=[f"README.md:{line}" for line, _ in BLOCKS])
def test_readme_python_block_runs_as_written(line, code, shared, tmp_path):
    run_block(code, f"README.md:{line}", shared, tmp_path)


@pytest.mark.parametrize("where, code, kind, reason", RUN, ids=[where for where, *_ in RUN])
def test_docs_python_block_runs_as_written(where, code, kind, reason, shared, tmp_path):
    if kind == "not-run":
        pytest.skip(f"{where} not run: {reason}")
    run_block(code, where, shared, tmp_path)


@pytest.mark.parametrize("where, code, kind, source", SOURCED, ids=[where for where, *_ in SOURCED])
def test_docs_block_equals_the_file_or_function_it_shows(where, code, kind, source):
    path = source.split("::")[0]
    expected = (ROOT / path).read_text(encoding="utf-8").rstrip("\n") if kind == "file" else function_source(source)
    assert code.rstrip("\n") == expected, f"{where} differs from {source}"
    run_by_dropin_tests = " ".join(target for target, _ in dropin_runs())
    assert path in run_by_dropin_tests, f"{where}: nothing runs {path} (tests/test_dropin_docs.py runs its examples)"
