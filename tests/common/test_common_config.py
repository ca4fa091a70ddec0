"""Tests for the shared YAML + dataclass configuration, atomic writes and the CLI dispatcher."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from pacs.metric.common.config import load_config, parse_overrides
from pacs.metric.common.errors import InputError, PacsError
from pacs.metric.common.io import write_json_atomic


@dataclasses.dataclass
class Inner:
    lr: float = 1e-4
    steps: int = 10


@dataclasses.dataclass
class Outer:
    name: str = "x"
    inner: Inner = dataclasses.field(default_factory=Inner)
    tags: list = dataclasses.field(default_factory=list)


def test_base_inheritance_and_overrides(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text("name: base\ninner:\n  lr: 0.5\n  steps: 3\n")
    (tmp_path / "child.yaml").write_text("_base_: base.yaml\ninner:\n  steps: 7\n")
    config = load_config(Outer, tmp_path / "child.yaml", ["inner.lr=0.25", "tags=[a, b]"])
    assert config.name == "base"
    assert config.inner == Inner(lr=0.25, steps=7)
    assert config.tags == ["a", "b"]


def test_nested_default_kept_when_partially_overridden() -> None:
    config = load_config(Outer, None, ["inner.steps=5"])
    assert config.inner.lr == 1e-4 and config.inner.steps == 5


def test_unknown_key_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="inner.*'stepz'"):
        load_config(Outer, None, ["inner.stepz=5"])


def test_base_cycle_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("_base_: b.yaml\n")
    (tmp_path / "b.yaml").write_text("_base_: a.yaml\n")
    with pytest.raises(InputError, match="cycle"):
        load_config(Outer, tmp_path / "a.yaml")


def test_override_without_equals_is_an_error() -> None:
    with pytest.raises(InputError, match="key=value"):
        parse_overrides(["nonsense"])


def test_atomic_json_leaves_no_partial_file(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    with pytest.raises(TypeError):
        write_json_atomic(target, {"bad": object()})
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []
    write_json_atomic(target, {"ok": 1})
    assert json.loads(target.read_text()) == {"ok": 1}


def test_dispatcher_turns_user_errors_into_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from pacs import cli as pacs_cli
    def failing(args: argparse.Namespace) -> int:
        raise PacsError("bad thing in item 7")

    parser = pacs_cli.build_parser()
    args = parser.parse_args([])
    args.func, args.command = failing, "demo"
    original = pacs_cli.build_parser
    try:
        pacs_cli.build_parser = lambda: _FixedParser(args)  # type: ignore[assignment]
        assert pacs_cli.main([]) == 2
    finally:
        pacs_cli.build_parser = original
    assert "bad thing in item 7" in capsys.readouterr().err


class _FixedParser:
    def __init__(self, args) -> None:
        self._args = args

    def parse_args(self, argv):
        return self._args


@dataclasses.dataclass
class WithMapping:
    random_config: dict = dataclasses.field(default_factory=dict)
    checkpoint: str = ""


def test_an_empty_mapping_clears_the_one_below_it_and_a_full_one_merges(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text("random_config: {width: 32, layers: 2}\n")
    (tmp_path / "more.yaml").write_text("_base_: base.yaml\nrandom_config: {layers: 4}\n")
    (tmp_path / "clear.yaml").write_text("_base_: base.yaml\nrandom_config: {}\ncheckpoint: clip.safetensors\n")
    assert load_config(WithMapping, tmp_path / "more.yaml").random_config == {"width": 32, "layers": 4}
    cleared = load_config(WithMapping, tmp_path / "clear.yaml")
    assert cleared.random_config == {} and cleared.checkpoint == "clip.safetensors"
    by_override = load_config(WithMapping, tmp_path / "base.yaml", ["random_config={}", "checkpoint=c.pt"])
    assert by_override.random_config == {} and by_override.checkpoint == "c.pt"
