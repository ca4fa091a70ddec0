"""Deprecated import paths kept for one release: an old module name that stands for its new home."""
from __future__ import annotations

import importlib
import sys
import types
import warnings
from typing import Any


class _ModuleAlias(types.ModuleType):
    """A module object that reads and writes its attributes through one or more new modules."""

    def __init__(self, name: str, targets: tuple[str, ...]) -> None:
        super().__init__(name, f"Deprecated alias of {', '.join(targets)}.")
        object.__setattr__(self, "_alias_targets", targets)

    def _modules(self) -> list[types.ModuleType]:
        return [importlib.import_module(target) for target in object.__getattribute__(self, "_alias_targets")]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):  # module machinery (inspect, pickle) reads these
            raise AttributeError(name)
        for module in self._modules():
            if hasattr(module, name):
                return getattr(module, name)
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("__") and name.endswith("__"):
            object.__setattr__(self, name, value)
            return
        for module in self._modules():
            if hasattr(module, name):
                setattr(module, name, value)
                return
        setattr(self._modules()[0], name, value)

    def __dir__(self) -> list[str]:
        return sorted({name for module in self._modules() for name in dir(module)})


def alias_module(old: str, *new: str) -> None:
    """Make module `old` stand for `new` (the first holds most names; later ones fill in), with a warning."""
    warnings.warn(f"`{old}` moved to `{new[0]}`; the old import path is deprecated and will be removed in "
                  "pacs 0.4", DeprecationWarning, stacklevel=3)
    if len(new) == 1:
        sys.modules[old] = importlib.import_module(new[0])
    else:
        alias = _ModuleAlias(old, new)
        alias._modules()  # import them now, as importing the old module did
        sys.modules[old] = alias
