"""The front page (README.md): short, its docs index complete, its extras table complete, its headline the run's.

Also the documentation site's pieces that need no build: the command pages' text and the API page's coverage
(tools/mkdocs_hooks.py); `mkdocs build --strict` itself runs in .ci/run.
"""
from __future__ import annotations

import configparser
import re
from pathlib import Path

import pytest
from script_modules import load_tool
from test_docs_self_contained import broken_links

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _between(text: str, name: str) -> str:
    (_, rest) = text.split(f"<!-- {name}:begin -->")
    return rest.split(f"<!-- {name}:end -->")[0]


def test_the_readme_is_at_most_200_lines():
    assert README.count("\n") <= 200


def test_the_docs_index_lists_every_page_and_each_link_resolves():
    index = _between(README, "docs-index")
    listed = re.findall(r"\]\(docs/([^)#]+\.md)\)", index)
    pages = sorted(path.name for path in (ROOT / "docs").glob("*.md"))
    assert sorted(set(listed)) == pages  # every page once, nothing that is not there
    assert len(listed) == len(set(listed))
    assert broken_links(ROOT / "README.md") == []


def test_the_index_check_fails_on_a_missing_page(tmp_path):
    """The checker itself: a listed page that does not exist is a broken link."""
    page = tmp_path / "README.md"
    (tmp_path / "docs").mkdir()
    page.write_text("[gone](docs/gone.md)\n")
    assert broken_links(page, tmp_path) == ["README.md:1: docs/gone.md (no such file)"]


def _extras() -> dict[str, list[str]]:
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg", encoding="utf-8")
    section = parser["options.extras_require"]
    return {name: [re.split(r"[<>=!~ ]", line.strip())[0] for line in section[name].splitlines() if line.strip()]
            for name in section}


def test_the_extras_table_lists_every_extra_with_its_packages():
    rows = dict(re.findall(r"(?m)^\| `([\w-]+)` \| ([^|]+) \|", README))
    extras = _extras()
    assert {"torchmetrics", "trl", "docs"} <= set(extras)
    assert sorted(rows) == sorted(extras)
    for name, packages in extras.items():
        assert [item.strip() for item in rows[name].split(",")] == packages, name


def test_the_headline_numbers_are_the_generated_blocks():
    """Each interval quoted in the README's headline is printed by the run, in docs/demo.md's generated block."""
    headline = " ".join(_between(README, "headline").split())
    block = _between((ROOT / "docs" / "demo.md").read_text(encoding="utf-8"), "demo-results")
    quoted = re.findall(r"((?:Judge-acc|Halluc\.) [+-][\d.]+(?: pts)? \[[+-][\d.]+, [+-][\d.]+\])", headline)
    assert len(quoted) == 3
    for claim in quoted:
        assert claim in block, claim


def test_the_demo_block_is_in_docs_demo_only():
    assert "demo-results:begin" not in README
    assert (ROOT / "docs" / "demo.md").read_text(encoding="utf-8").count("<!-- demo-results:begin -->") == 1


@pytest.fixture(scope="module")
def hooks():
    """tools/mkdocs_hooks.py as a module (needs mkdocs: the `docs` extra)."""
    pytest.importorskip("mkdocs")
    return load_tool("mkdocs_hooks")


def test_every_command_gets_a_page_of_its_help(hooks):
    from pacs import cli

    helps = hooks.command_helps()
    parser = cli.build_parser()
    (action,) = [a for a in parser._actions if a.dest == "command"]
    assert list(helps) == list(action.choices) and len(helps) >= 10
    page = hooks.command_page("score", helps["score"])
    assert page.startswith("# `pacs score`\n") and "usage: pacs score" in page and "--metric" in page
    assert max(len(line) for line in helps["score"].splitlines()) <= int(hooks.HELP_WIDTH)


def test_the_api_page_renders_every_public_name(hooks):
    api = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    assert hooks.undocumented_public_names(api) == []
    dropped = api.replace("::: pacs.eval.cider.cider_d\n", "")
    assert hooks.undocumented_public_names(dropped) == [
        "pacs.cider_d (add `::: pacs.eval.cider.cider_d` to docs/api.md)",
        "pacs.eval.cider_d (add `::: pacs.eval.cider.cider_d` to docs/api.md)"]


def test_doctest_lines_are_fenced(hooks):
    text = "Intro.\n\n>>> x = 1\n>>> x\n1\n\nAfter."
    assert hooks.fence_doctests(text) == "Intro.\n\n```pycon\n>>> x = 1\n>>> x\n1\n```\n\nAfter."


def test_links_out_of_docs_become_paths_and_a_missing_one_warns(hooks, caplog):
    docs = ROOT / "docs"
    page = "see [CHANGELOG.md](../CHANGELOG.md), [x](demo.md#seeds) and [r](../README.md#install-extras)\n"
    assert hooks.rewrite_links(page, docs / "install.md", "install.md", docs) == (
        "see `CHANGELOG.md`, [x](demo.md#seeds) and [r](index.md#install-extras)\n")
    home = "[d](docs/demo.md) [c](CHANGELOG.md)\n```\n[not a link](nowhere.md)\n```\n"
    assert hooks.rewrite_links(home, ROOT / "README.md", "index.md", docs) == (
        "[d](demo.md) c (`CHANGELOG.md`)\n```\n[not a link](nowhere.md)\n```\n")
    with caplog.at_level("WARNING", logger="mkdocs.hooks.pacs"):
        hooks.rewrite_links("[gone](../gone.md)\n", docs / "cli.md", "cli.md", docs)
    assert "docs/cli.md: link to ../gone.md, which does not exist" in caplog.text
