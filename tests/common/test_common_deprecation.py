"""Old import paths kept for one release stand for the new modules: same objects, patches reach the new home."""
from __future__ import annotations

import sys
import types
import warnings

import pytest

from metric.common.deprecation import alias_module


@pytest.fixture()
def new_modules(monkeypatch: pytest.MonkeyPatch) -> tuple[types.ModuleType, types.ModuleType]:
    """Two throw-away 'new' modules registered in sys.modules."""
    first, second = types.ModuleType("pacs_test_new_a"), types.ModuleType("pacs_test_new_b")
    first.shared, first.only_a = "from a", 1
    second.shared, second.only_b = "from b", 2
    monkeypatch.setitem(sys.modules, first.__name__, first)
    monkeypatch.setitem(sys.modules, second.__name__, second)
    monkeypatch.delitem(sys.modules, "pacs_test_old", raising=False)
    return first, second


def test_single_target_alias_is_the_new_module_itself(new_modules):
    first, _ = new_modules
    with pytest.warns(DeprecationWarning, match="pacs_test_old` moved to `pacs_test_new_a"):
        alias_module("pacs_test_old", "pacs_test_new_a")
    assert sys.modules["pacs_test_old"] is first


def test_several_targets_read_in_order_and_writes_reach_the_owner(new_modules):
    first, second = new_modules
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        alias_module("pacs_test_old", "pacs_test_new_a", "pacs_test_new_b")
    old = sys.modules["pacs_test_old"]
    assert (old.shared, old.only_a, old.only_b) == ("from a", 1, 2)
    old.only_b = 20  # a monkeypatch through the old path changes the module that owns the name
    assert second.only_b == 20 and not hasattr(first, "only_b")
    assert {"only_a", "only_b", "shared"} <= set(dir(old))
    with pytest.raises(AttributeError, match="has no attribute 'missing'"):
        old.missing  # noqa: B018

