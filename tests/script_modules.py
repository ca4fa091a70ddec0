"""Scripts of tools/ and recipes/ (not packages) loaded as modules, for tests that call their `main`."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

TOOLS = Path(__file__).resolve().parents[1] / "tools"


def load_tool(name: str) -> ModuleType:
    """`tools/<name>.py` as a module."""
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_captioner_testkit() -> ModuleType:
    """tests/captioner/captioner_testkit.py (tiny features, tiny captioner), loaded from its file."""
    path = Path(__file__).resolve().parent / "captioner" / "captioner_testkit.py"
    spec = importlib.util.spec_from_file_location("captioner_testkit", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
