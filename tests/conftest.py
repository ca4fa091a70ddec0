"""Shared test fixtures: the PACS_SHARED data folder (missing data fails in CI, skips elsewhere)."""
from __future__ import annotations

import dataclasses
import logging
import os
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Every test runs torch on one thread, whichever test files are collected: the float results of a run do not depend
# on which conftests were imported, and two test processes do not oversubscribe two cores.
torch.set_num_threads(1)


def _shared_root() -> Path | None:
    value = os.environ.get("PACS_SHARED")
    if value:
        return Path(value)
    guess = Path(__file__).resolve().parents[2] / "shared"
    return guess if guess.is_dir() else None


@pytest.fixture(scope="session")
def shared() -> Path:
    """The shared folder (data/ and fixtures/); a failure in CI when missing, a skip elsewhere."""
    root = _shared_root()
    if root is None or not (root / "data").is_dir():
        message = "shared data not found: set PACS_SHARED to the folder holding data/ and fixtures/"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return root


@pytest.fixture(scope="session")
def shared_data(shared: Path) -> Path:
    """The shared data/ folder."""
    return shared / "data"


@pytest.fixture(scope="session")
def shared_fixtures(shared: Path) -> Path:
    """The shared fixtures/ folder."""
    return shared / "fixtures"


# --- Nothing a test changes outlives it -----------------------------------------------------------------------
# Every test runs under this guard. It records the process-wide state tests are known to touch (environment,
# working directory, sys.path, logging handlers and levels, torch's thread count and default dtype, the
# registries, and every attribute of every pacs module) and compares it after the test. Anything left changed
# is put back, and the test errors naming what it leaked, so one test's leftovers never reach the next one.

PROJECT_PACKAGES = ("pacs",)
PYTEST_OWN_VARIABLES = ("PYTEST_CURRENT_TEST",)
# Set by libraries themselves the first time they are imported or used (open_clip's tokenizer module, torch's
# inductor cache behind fused optimizers); whichever test happens to come first would otherwise be blamed.
LIBRARY_FIRST_USE_VARIABLES = ("TOKENIZERS_PARALLELISM", "TORCHINDUCTOR_CACHE_DIR")


def _environ() -> dict[str, str]:
    """The environment, less pytest's own per-phase variable and the variables libraries set on first use."""
    return {key: value for key, value in os.environ.items()
            if key not in PYTEST_OWN_VARIABLES + LIBRARY_FIRST_USE_VARIABLES}


def _project_modules() -> dict[str, types.ModuleType]:
    """The imported modules of this project, by name."""
    return {name: module for name, module in list(sys.modules.items())
            if module is not None and name.split(".")[0] in PROJECT_PACKAGES}


def _registries() -> dict[str, tuple[dict, dict]]:
    """Every upper-case module-level dict of the project (registries and tables) with a copy of it."""
    found = {}
    for name, module in _project_modules().items():
        for attribute, value in list(vars(module).items()):
            if attribute.isupper() and type(value) is dict:
                found[f"{name}.{attribute}"] = (value, dict(value))
    return found


def _defined_in_project(value: object) -> bool:
    """Whether a registry entry comes from a project module (not from a test)."""
    module = getattr(value, "__module__", None) or type(value).__module__
    return module.split(".")[0] in PROJECT_PACKAGES


def _loggers() -> dict[str, tuple[logging.Logger, list, int, bool]]:
    """The root logger and the project's loggers with their handlers, level and propagation flag.

    Libraries' own loggers are left out: diffusers, transformers and others configure theirs once, when first used.
    """
    manager = logging.Logger.manager
    loggers = {"": logging.getLogger()} | {name: logger for name, logger in list(manager.loggerDict.items())
                                           if isinstance(logger, logging.Logger)
                                           and name.split(".")[0] in PROJECT_PACKAGES}
    return {name: (logger, list(logger.handlers), logger.level, logger.propagate) for name, logger in loggers.items()}


@dataclasses.dataclass
class _GlobalState:
    environ: dict[str, str]
    cwd: str
    sys_path: list[str]
    threads: int
    dtype: torch.dtype
    attributes: dict[str, dict[str, object]]
    registries: dict[str, tuple[dict, dict]]
    loggers: dict[str, tuple[logging.Logger, list, int, bool]]

    @classmethod
    def capture(cls) -> _GlobalState:
        """The state now."""
        return cls(environ=_environ(), cwd=os.getcwd(), sys_path=list(sys.path),
                   threads=torch.get_num_threads(), dtype=torch.get_default_dtype(),
                   attributes={name: dict(vars(module)) for name, module in _project_modules().items()},
                   registries=_registries(), loggers=_loggers())

    def restore(self) -> list[str]:
        """Put back whatever differs from this state; one line per difference."""
        leaks = []
        if _environ() != self.environ:
            changed = sorted(set(_environ().items()) ^ set(self.environ.items()))
            leaks.append(f"environment variables {sorted({key for key, _ in changed})}")
            for key in set(_environ()) - set(self.environ):
                del os.environ[key]
            os.environ.update(self.environ)
        if os.getcwd() != self.cwd:
            leaks.append(f"working directory {os.getcwd()}")
            os.chdir(self.cwd)
        if sys.path != self.sys_path:
            leaks.append("sys.path")
            sys.path[:] = self.sys_path
        if torch.get_num_threads() != self.threads:
            leaks.append(f"torch thread count {torch.get_num_threads()} (was {self.threads})")
            torch.set_num_threads(self.threads)
        if torch.get_default_dtype() != self.dtype:
            leaks.append(f"torch default dtype {torch.get_default_dtype()}")
            torch.set_default_dtype(self.dtype)
        modules = _project_modules()
        for name, before in self.attributes.items():
            module = modules.get(name)
            if module is None:
                continue
            now = vars(module)
            for attribute, value in before.items():
                if attribute not in now or now[attribute] is not value:
                    leaks.append(f"attribute {name}.{attribute}")
                    setattr(module, attribute, value)
        for name, (table, before) in self.registries.items():
            # entries the project adds when a module is first imported (lazy built-ins) may stay
            added = {key for key in set(table) - set(before) if not _defined_in_project(table[key])}
            removed = set(before) - set(table)
            if added or removed:
                leaks.append(f"registry {name} entries {sorted(map(str, added | removed))}")
                for key in added:
                    del table[key]
                table.update({key: before[key] for key in removed})
        for name, (logger, *_) in _loggers().items():
            if name not in self.loggers and logger.handlers:  # a logger the test created, with handlers
                leaks.append(f"logger {name!r} (handlers)")
                logger.handlers.clear()
        for name, (logger, handlers, level, propagate) in self.loggers.items():
            if logger.handlers != handlers or logger.level != level or logger.propagate != propagate:
                leaks.append(f"logger {name or 'root'!r} (handlers, level or propagation)")
                logger.handlers[:] = handlers
                logger.setLevel(level)
                logger.propagate = propagate
        return leaks


@pytest.fixture()
def torch_threads_restored() -> Iterator[None]:
    """For a test that runs `pacs train` in-process: the run sets torch's thread count (`threads=`) on purpose."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture()
def registries_restored() -> Iterator[None]:
    """Put the project's registries back as they were after a test that registers entries on purpose.

    Entries a project module registered while the test ran (built-ins registered when their module is first
    imported) stay: their module stays imported, so removing them would empty the registry for every later test.
    """
    before = {name: dict(copy) for name, (_, copy) in _registries().items()}
    yield
    for name, (table, _) in _registries().items():
        if name in before:
            for key in set(table) - set(before[name]):
                if not _defined_in_project(table[key]):
                    del table[key]
            table.update(before[name])


@pytest.fixture(autouse=True)
def _leaves_nothing_behind(request: pytest.FixtureRequest) -> Iterator[None]:
    """Error a test that leaves process-wide state changed (after restoring it)."""
    before = _GlobalState.capture()
    yield
    leaks = before.restore()
    if leaks:
        pytest.fail(f"{request.node.nodeid} left global state changed (restored now): " + "; ".join(leaks),
                    pytrace=False)
