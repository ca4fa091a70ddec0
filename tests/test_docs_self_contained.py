"""A clone is self-contained: no spec file outside the repository is cited, and every relative docs link resolves.

The specifications the code relies on (official checkpoint format, formulas, data layouts and CLI contracts)
live in docs/. Tracked *.py and *.md files outside tests/ must not cite the research folder's spec files
(`../shared/DESIGN.md`, `../shared/REFERENCE.md`, `../shared/fixtures/**/FORMAT.md`, nor those names bare);
data paths such as `../shared/data/flickr8k` in example commands are data and stay allowed. Every relative link
in README.md and docs/*.md must point at an existing file and, for a Markdown target, at an existing heading.
"""
from __future__ import annotations

import re
import subprocess
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A citation of a spec file of the research folder, with or without its path.
_SPEC_CITATION = re.compile(
    r"\.\./shared/(?:DESIGN|REFERENCE)\.md"
    r"|\.\./shared/fixtures/\S*FORMAT\.md"
    r"|\b(?:DESIGN|REFERENCE|FORMAT)\.md\b"
    r"|\bREFERENCE §"
)
_FENCE = re.compile(r"^\s*(```|~~~)")
_INLINE_CODE = re.compile(r"`+[^`]*`+")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def tracked_files(*suffixes: str) -> list[Path]:
    """Tracked files of the repository with one of `suffixes` (every file under ROOT when git is unavailable)."""
    try:
        listing = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout
        names = [name for name in listing.decode("utf-8").split("\0") if name]
    except (OSError, subprocess.CalledProcessError):
        names = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if ".git" not in p.parts and p.is_file()]
    return sorted(ROOT / name for name in names if name.endswith(suffixes) and (ROOT / name).is_file())


def spec_citations(text: str) -> list[tuple[int, str]]:
    """(line number, matched text) of every citation of an outside spec file in `text`."""
    return [(number, match.group(0)) for number, line in enumerate(text.splitlines(), 1)
            for match in _SPEC_CITATION.finditer(line)]


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the Markdown lines outside fenced code blocks, inline code removed."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, _INLINE_CODE.sub("", line)))
    return lines


def heading_slug(heading: str) -> str:
    """GitHub's anchor of a heading: rendered text, lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link renders as its text
    text = text.replace("`", "").strip().lower()
    kept = "".join(ch for ch in text if ch in " -_" or unicodedata.category(ch)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading anchor of a Markdown text (repeated headings get -1, -2, ... as on GitHub)."""
    seen: dict[str, int] = {}
    result: set[str] = set()
    fenced = False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else _HEADING.match(line)
        if match is None:
            continue
        slug = heading_slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        result.add(slug if count == 0 else f"{slug}-{count}")
    return result


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """Relative links of a Markdown file whose target file (or heading) does not exist (paths shown from `root`)."""
    text = path.read_text(encoding="utf-8")
    problems = []
    for number, line in prose_lines(text):
        for match in _LINK.finditer(line):
            target = match.group(1)
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # http:, https:, mailto:, ...
                continue
            file_part, _, anchor = target.partition("#")
            destination = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(root)}:{number}: {target}"
            if not destination.exists():
                problems.append(f"{where} (no such file)")
            elif anchor and destination.suffix == ".md" and anchor not in anchors(
                    destination.read_text(encoding="utf-8")):
                problems.append(f"{where} (no heading #{anchor} in {destination.name})")
    return problems


def test_the_citation_detector_flags_spec_files_and_spares_data_paths():
    """The scanner itself: every form of spec citation is found; data paths and look-alike names are not."""
    flagged = ["see ../shared/DESIGN.md", "(../shared/REFERENCE.md §7.1)", "`../shared/fixtures/pacscore/FORMAT.md`",
               "as in DESIGN.md", "REFERENCE.md §6.3", "(REFERENCE §6.3)", "fixtures/pacscore/FORMAT.md §2"]
    spared = ["pacs correlate flickr8k-expert --data ../shared/data/flickr8k", "PACS_SHARED=../shared python x.py",
              "REFERENCES_FILE = 'anet.json'", "REFERENCE_SETTINGS = (0, 1, 9)", "docs/formulas.md",
              "docs/data_layouts.md", "DESIGN_md", "MY_FORMAT.mdx"]
    for line in flagged:
        assert spec_citations(line), line
    for line in spared:
        assert spec_citations(line) == [], line
    assert spec_citations("ok\nok\nsee DESIGN.md") == [(3, "DESIGN.md")]


def test_the_link_checker_finds_missing_files_and_headings(tmp_path):
    """The link checker itself, on a small docs tree: good links pass, a missing file or heading is reported."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "b.md").write_text("# Title\n## The run directory (what `pacs report` reads)\n## Title\n")
    page = tmp_path / "docs" / "a.md"
    page.write_text(
        "# A\n[ok](b.md) [ok](b.md#the-run-directory-what-pacs-report-reads) [ok](b.md#title-1) [self](#a)\n"
        "[web](https://example.com/x.md) `[code](missing.md)`\n"
        "```\n[fenced](missing.md)\n```\n"
        "[bad](missing.md) [bad anchor](b.md#nope)\n")
    assert broken_links(page, tmp_path) == ["docs/a.md:7: missing.md (no such file)",
                                  "docs/a.md:7: b.md#nope (no heading #nope in b.md)"]


def test_no_tracked_file_cites_spec_files_outside_the_repository():
    """Docs, code comments and docstrings cite docs/ pages, never the research folder's spec files."""
    files = [p for p in tracked_files(".py", ".md") if p.relative_to(ROOT).parts[0] != "tests"]
    assert files, "no tracked files found"
    offenders = [f"{path.relative_to(ROOT)}:{number}: {found}"
                 for path in files for number, found in spec_citations(path.read_text(encoding="utf-8"))]
    assert offenders == [], "cite docs/official_format.md, docs/formulas.md or docs/data_layouts.md instead:\n" + \
        "\n".join(offenders)


@pytest.mark.parametrize("page", ["docs/official_format.md", "docs/formulas.md", "docs/data_layouts.md"])
def test_the_spec_pages_exist_and_the_readme_links_them(page):
    """The pages that replace the outside spec files are in the repository and listed in the README."""
    assert (ROOT / page).is_file()
    assert f"]({page})" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_every_relative_link_in_the_docs_resolves():
    """Every relative link of README.md and docs/*.md points at an existing file (and heading)."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    problems = [problem for page in pages for problem in broken_links(page)]
    assert problems == [], "\n".join(problems)
