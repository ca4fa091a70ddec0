"""mkdocs hooks: the README as the site's home, a page per `pacs` command, links out of docs/, API coverage.

- The site's home page is README.md (its links into docs/ rewritten), so the front page and the site share one text.
- `commands/<name>.md` is generated for every sub-command from `pacs <name> --help` (fixed width, so the pages
  do not depend on the terminal) and added to the nav under "Commands".
- A relative link to a repository file outside docs/ (CHANGELOG.md, a source file) has no page on the site: it is
  written as the file's path in code; a link to a file that does not exist is a warning (`--strict` fails).
- Doctest examples in docstrings (`>>>` lines and their output) are rendered as code (`DoctestFences`, a griffe
  extension named in mkdocs.yml), not as Markdown quotes and links.
- Every public name of `pacs`, `pacs.metric`, `pacs.eval` and `pacs.rewards` must be rendered by docs/api.md
  (`::: module.name` of its defining object) and have a docstring: a missing one is a warning.
"""
from __future__ import annotations

import importlib
import inspect
import logging
import os
import posixpath
import re
from pathlib import Path

import griffe
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

log = logging.getLogger("mkdocs.hooks.pacs")
ROOT = Path(__file__).resolve().parents[1]
PUBLIC_MODULES = ("pacs", "pacs.metric", "pacs.eval", "pacs.rewards")
API_VIEW = ROOT / "build" / "api-view"  # mkdocs.yml: the python handler's `paths`
#: setup.cfg package_dir: the folders mapped into the `pacs` namespace
PACKAGE_FOLDERS = {"captioner": "captioner", "eval": "eval", "metric": "metric", "rewards": "rewards",
                   "configs": "recipes/configs"}
HELP_WIDTH = "100"
_LINK = re.compile(r"(!?\[(?:[^\[\]]|\[[^\]]*\])*\])\(\s*<?([^)\s>]+)>?\s*\)")
_FENCE = re.compile(r"^\s*(```|~~~)")


def command_helps() -> dict[str, str]:
    """`pacs NAME --help` of every sub-command, at a fixed width, by name (in the CLI's order)."""
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_WIDTH  # argparse wraps at $COLUMNS
    try:
        from pacs import cli

        parser = cli.build_parser()
        (action,) = [a for a in parser._actions if a.dest == "command"]
        return {name: sub.format_help() for name, sub in action.choices.items()}
    finally:
        if previous is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = previous


def command_page(name: str, help_text: str) -> str:
    """The Markdown page of one sub-command."""
    return (f"# `pacs {name}`\n\nGenerated from `pacs {name} --help` when the site is built.\n\n"
            f"```text\n{help_text.rstrip()}\n```\n")


def undocumented_public_names(api_page: str) -> list[str]:
    """Public names (package.name) that docs/api.md does not render, or whose object has no docstring."""
    rendered = set(re.findall(r"(?m)^:::\s*(\S+)", api_page))
    problems = []
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            path = f"{obj.__module__}.{obj.__qualname__}"
            if path not in rendered:
                problems.append(f"{module_name}.{name} (add `::: {path}` to docs/api.md)")
            elif not inspect.getdoc(obj):
                problems.append(f"{module_name}.{name} (no docstring)")
    return problems


def rewrite_links(markdown: str, source: Path, page_uri: str, docs_dir: Path) -> str:
    """The relative links of `source` (shown on the site as `page_uri`) made relative to that page: a link into
    docs/ stays a link, one to README.md goes to the home page, one to another repository file becomes the file's
    path in code; a link to a missing file is a warning."""
    where = os.path.relpath(source, ROOT)
    lines, fenced = [], False
    for line in markdown.split("\n"):
        if _FENCE.match(line):
            fenced = not fenced
        if not fenced:
            def replace(match: re.Match) -> str:
                label, target = match.group(1), match.group(2)
                if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("#"):
                    return match.group(0)
                file_part, _, anchor = target.partition("#")
                resolved = (source.parent / file_part).resolve()
                if not resolved.exists():
                    log.warning("%s: link to %s, which does not exist", where, target)
                    return match.group(0)
                suffix = f"#{anchor}" if anchor else ""
                page_dir = posixpath.dirname(page_uri) or "."
                if resolved == ROOT / "README.md":
                    return f"{label}({posixpath.relpath('index.md', page_dir)}{suffix})"
                if resolved == docs_dir or docs_dir in resolved.parents:
                    inside = os.path.relpath(resolved, docs_dir).replace(os.sep, "/")
                    return f"{label}({posixpath.relpath(inside, page_dir)}{suffix})"
                outside, text = os.path.relpath(resolved, ROOT), label[1:-1]
                return f"`{outside}`" if text.strip("`") == outside else f"{text} (`{outside}`)"
            line = _LINK.sub(replace, line)
        lines.append(line)
    return "\n".join(lines)


def fence_doctests(text: str) -> str:
    """`text` with each run of doctest lines (`>>>`, `...` and the output up to a blank line) in a ```pycon fence."""
    out, in_example = [], False
    for line in text.split("\n"):
        starts = line.lstrip().startswith(">>>")
        if starts and not in_example:
            out.append("```pycon")
            in_example = True
        elif in_example and not line.strip():
            out.append("```")
            in_example = False
        out.append(line)
    if in_example:
        out.append("```")
    return "\n".join(out)


class DoctestFences(griffe.Extension):
    """Fence the doctest examples of every docstring, so that mkdocstrings renders them as code."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: object) -> None:
        """Rewrite `obj`'s docstring in place."""
        if obj.docstring is not None and ">>>" in obj.docstring.value:
            obj.docstring.value = fence_doctests(obj.docstring.value)


def build_api_view(view: Path = API_VIEW) -> Path:
    """`view/pacs/`: links to pacs/*.py and to each mapped folder, the installed layout that griffe can read."""
    package = view / "pacs"
    if view.exists():
        for link in sorted(package.iterdir()) if package.is_dir() else []:
            link.unlink()
    package.mkdir(parents=True, exist_ok=True)
    for source in sorted((ROOT / "pacs").glob("*.py")):
        (package / source.name).symlink_to(source)
    for name, folder in PACKAGE_FOLDERS.items():
        (package / name).symlink_to(ROOT / folder, target_is_directory=True)
    return view


@event_priority(100)  # before mkdocstrings reads its handler paths
def on_config(config):
    """Link the package layout for mkdocstrings; add the generated command pages to the nav."""
    build_api_view()
    config["nav"].append({"Commands": [{f"pacs {name}": f"commands/{name}.md"} for name in command_helps()]})
    return config


def on_files(files, config):
    """The README as index.md (links into docs/ made relative to it) and one page per command."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    files.append(File.generated(config, "index.md", content=readme))
    for name, help_text in command_helps().items():
        files.append(File.generated(config, f"commands/{name}.md", content=command_page(name, help_text)))
    return files


def on_page_markdown(markdown, page, config, files):
    """Rewrite links that leave docs/; check the API page's coverage."""
    docs_dir = Path(config["docs_dir"]).resolve()
    uri = page.file.src_uri
    if not page.file.generated_by:  # a file of docs/
        markdown = rewrite_links(markdown, docs_dir / uri, uri, docs_dir)
    elif uri == "index.md":  # the README: its links are relative to the repository root
        markdown = rewrite_links(markdown, ROOT / "README.md", uri, docs_dir)
    if page.file.src_uri == "api.md":
        for problem in undocumented_public_names(markdown):
            log.warning("undocumented public name: %s", problem)
    return markdown
