"""What a data set brings to a recipe run besides its items: an exact judge of captions (evaluation columns), the
context its own rewards need, whether its loader makes its image folder, where its `path` leads and what else
identifies its content in the stages' fingerprints.

A data set registers its extras under its `pacs.captioner.data.DATASETS` name (`register_data_source`); the recipe
pipeline asks `data_source(name)` and never imports the data set's package. The embedded demo world
(`pacs.captioner.demo.world_source`, data set `demo-world`) is one: its judge gives every test set the columns
`Judge-acc`, `Judge` and `Halluc.`, its scenes are the context of the oracle reward `judge`, and it trains its own
CLIP and PAC-S++ (a recipe's `metric_training`, `pacs.captioner.orchestration.metric_training`).
"""
from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

CaptionJudge = Callable[[Sequence[str], Sequence[str]], dict[str, np.ndarray]]
"""`judge(image_ids, captions) -> {column: per-caption values}` (columns of `pacs.eval.columns.JUDGE_COLUMNS`)."""


@dataclass(frozen=True)
class MetricTraining:
    """How a data set trains its own contrastive models: `settings`, the dataclass of a recipe's `metric_training`
    section; `check(data, settings)` raises an InputError when they do not fit the data set; `train_clip(data,
    settings, seed, folder)` trains a CLIP into `folder` (its checkpoint
    `folder/checkpoint.safetensors`) and `train_pacs(data, settings, seed, clip_folder, folder)` PAC-S++ from
    that CLIP; both run on every process and return the stage's JSON summary (`data`: the data set's mapping)."""

    settings: type
    check: Callable[[Mapping[str, Any], Any], None]
    train_clip: Callable[[Mapping[str, Any], Any, int, Path], dict[str, Any]]
    train_pacs: Callable[[Mapping[str, Any], Any, int, Path, Path], dict[str, Any]]


@dataclass(frozen=True)
class DataSource:
    """A data set's extras; `judge(data)` and `reward_context(data)` take the data set's mapping (`name`, `path`,
    `image_root`, `options`, as in a `data` section or a test set)."""

    judge: Callable[[Mapping[str, Any]], CaptionJudge] | None = None
    reward_context: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    makes_image_root: bool = False  # the loader writes the images into `image_root` (it need not exist yet)
    locate: Callable[[str], Path] | None = None  # the file `path` names (e.g. a packaged config's name); None: itself
    content: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None  # fingerprinted besides the file: what
    # the file leads to (a world's settings merged from its `_base_` files)
    # `candidates(data, image_ids, settings, seed)`: captions of varied quality for those images with the judge's
    # verdicts (`pacs.captioner.orchestration.judge_correlation.Candidates`; `settings` a `CorrelationConfig`):
    # what a recipe's `correlation/<set>` stage correlates every metric with
    candidates: Callable[[Mapping[str, Any], Sequence[str], Any, int], Any] | None = None
    metric_training: MetricTraining | None = None  # the stages `clip` and `pacs` of a recipe on it

    def path_of(self, path: str) -> Path:
        """The file or folder a data set's `path` names."""
        return Path(path).expanduser() if self.locate is None else self.locate(path)


PLAIN = DataSource()
"""A data set of files: no judge, no reward context, its image folder given."""
_SOURCES: dict[str, DataSource] = {}
BUILT_IN: dict[str, str] = {"demo-world": "pacs.captioner.demo.world_source"}
"""The data sets pacs itself brings, by the module that registers each: imported when the name is first asked
for (named by string, so this layer does not import the demo's), so a config loads without `pacs.captioner.entry`."""


def _known(key: str) -> None:
    """Register built-in data set `key` if it is one and is not registered yet."""
    if key not in _SOURCES and key in BUILT_IN:
        importlib.import_module(BUILT_IN[key])


def register_data_source(name: str, source: DataSource) -> None:
    """Register the extras of data set `name` (case-insensitive; again with the same extras: a no-op)."""
    key = name.lower()
    if _SOURCES.get(key, source) != source:
        raise ValueError(f"data set {name!r} already has other extras registered")
    _SOURCES[key] = source


def data_source(name: str) -> DataSource:
    """The extras of data set `name` (`PLAIN` for a data set that registered none)."""
    key = str(name).lower()
    _known(key)
    return _SOURCES.get(key, PLAIN)


def training_data_sets() -> list[str]:
    """The data sets that train their own contrastive models (`DataSource.metric_training`)."""
    for key in BUILT_IN:
        _known(key)
    return sorted(name for name, source in _SOURCES.items() if source.metric_training is not None)


def data_mapping(data: Any) -> dict[str, Any]:
    """A data set's settings as a mapping (a `DataConfig` or a test set's mapping)."""
    return dataclasses.asdict(data) if dataclasses.is_dataclass(data) else dict(data)


def judge_of(data: Mapping[str, Any]) -> CaptionJudge | None:
    """The caption judge of a data set mapping (None: it has none)."""
    source = data_source(data.get("name", ""))
    return None if source.judge is None else source.judge(data)


def registered_modules() -> list[str]:
    """The modules that registered data sources (a spawned process imports them to know the same data sets)."""
    return sorted({function.__module__ for source in _SOURCES.values()
                   for function in (source.judge, source.reward_context, source.locate, source.content,
                                     source.candidates, source.metric_training and source.metric_training.train_clip)
                   if function is not None})
