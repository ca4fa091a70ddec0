"""Fixtures of the eval tests: a machine with or without Java (the Java lookup faked through shutil.which)."""
from __future__ import annotations

import shutil

import pytest


def _java_lookup(monkeypatch: pytest.MonkeyPatch, found: str | None) -> None:
    """No PACS_JAVA / JAVA_HOME; a PATH lookup of any program gives `found`."""
    monkeypatch.delenv("PACS_JAVA", raising=False)
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setattr(shutil, "which", lambda name, *args, **kwargs: found)


@pytest.fixture
def no_java(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine without Java: PATH lookup finds nothing, no PACS_JAVA / JAVA_HOME."""
    _java_lookup(monkeypatch, None)


@pytest.fixture
def java_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine whose PATH has Java (/opt/jre/bin/java), no PACS_JAVA / JAVA_HOME."""
    _java_lookup(monkeypatch, "/opt/jre/bin/java")
