"""No import circles in pacs, counting every import: at module level and inside functions.

`lint-imports` (CI) sees module-level imports only, so a circle hidden by an import inside a function passes it.
This test parses every module of the `pacs` namespace (the folders setup.cfg maps into it), resolves each
`import` / `from ... import` to the first-party module it loads, and fails on any cycle of that graph.
"""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# setup.cfg's package_dir: the namespace's packages and the folders they live in
FOLDERS = {"pacs": REPO / "pacs", "pacs.captioner": REPO / "captioner", "pacs.eval": REPO / "eval",
           "pacs.metric": REPO / "metric", "pacs.rewards": REPO / "rewards", "pacs.configs": REPO / "recipes" / "configs"}


def first_party_modules() -> dict[str, Path]:
    """Every module of the namespace, by dotted name."""
    modules: dict[str, Path] = {}
    for package, folder in FOLDERS.items():
        for path in folder.rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if package == "pacs" and parts and parts[0] in {"captioner", "eval", "metric", "rewards", "configs"}:
                continue  # mapped folders, never under pacs/ itself
            modules[".".join([package, *parts])] = path
    return modules


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The first-party modules `name` imports anywhere in its body (functions included)."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            # `from pkg import name`: the submodule `pkg.name` when there is one, else `pkg` itself (the parent
            # packages that every import loads first are not edges: a package's __init__ is not its submodules)
            targets = [f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in modules else origin
                       for alias in node.names]
        for target in targets:
            while target and target not in modules:  # `import pkg.mod.name` or a third-party name
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph.get(node, ())):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def import_graph() -> dict[str, set[str]]:
    """Module -> the first-party modules it imports."""
    modules = first_party_modules()
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def test_the_graph_sees_imports_inside_functions() -> None:
    graph = import_graph()
    # pacs.cli imports the sub-command modules' helpers inside `main` (cli_message) and at the top (launching)
    assert "pacs.metric.commands.flags" in graph["pacs.cli"]
    assert "pacs.captioner.orchestration.launching" in graph["pacs.cli"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles_among_first_party_modules() -> None:
    found = cycles(import_graph())
    assert found == [], "import cycles (imports inside functions count):\n" + "\n".join(
        " <-> ".join(component) for component in found)
