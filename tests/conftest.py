"""Shared test fixtures: the PACS_SHARED data folder (missing data fails in CI, skips elsewhere)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


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
