"""The embedded demo: a procedural world with an exact judge, and the offline end-to-end pipeline over it."""
from __future__ import annotations

from typing import Any


def run_demo(config_path: str | None = None, overrides: list[str] | None = None,
             force: list[str] | None = None) -> dict[str, Any]:
    """Run the demo described by the `demo:` section of `config_path` (default recipes/configs/demo.yaml)."""
    from pacs.captioner.demo.pipeline import run_demo as _run

    return _run(config_path, overrides, force)
