"""The fingerprints of the recipe pipeline's stages (`pacs.captioner.orchestration.pipeline`): which settings and inputs
determine vocab, features/<set>, xe, scst-<reward> and eval/<model>/<set> (rules in `pacs.captioner.orchestration.stages`).

Settings that do not change what a stage computes are left out, so changing them never re-runs anything: where
a stage writes (`output_dir`, `resume`), how work is cut (`micro_batch_size`, feature `batch_size` /
`shard_size`, evaluation `batch_size`; these change only the order of floating-point sums), logging
(`log_every`, `trackers`, `tensorboard`) and checkpoint cadence (`save_every`, `keep_checkpoints`), and devices.
Shared by the recipe pipeline and the demo.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pacs.captioner.orchestration.data_sources import data_mapping, data_source
from pacs.captioner.orchestration.stages import StageRunner, file_input

NOT_DETERMINING = frozenset({"output_dir", "resume", "micro_batch_size", "log_every", "tensorboard",
                             "trackers", "save_every", "keep_checkpoints", "device", "workers"})


def settings_of(config: Any, drop: frozenset[str] | set[str] = NOT_DETERMINING) -> dict[str, Any]:
    """A dataclass (or mapping) as a dict without the keys in `drop` (at any depth)."""
    data = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)
    return _without(data, drop)


def trainer_settings(config: Any) -> dict[str, Any]:
    """`settings_of` an XE or SCST config, fingerprinted as before the shared trainer names (done runs stay done).

    `eval_every` is fingerprinted under XE's former name `val_every`; SCST's (always 0: it does not validate
    while training) is left out, as SCST had no such setting.
    """
    settings = settings_of(config)
    every = settings.pop("eval_every", 0)
    if every:
        settings["val_every"] = every
    return settings


def reward_model_settings(models: Any) -> dict[str, Any]:
    """`settings_of` the `reward_models` section; the default fp32 `dtype` is left out (runs of 0.2 stay done)."""
    settings = settings_of(models)
    if settings.get("dtype", "fp32") == "fp32":
        settings.pop("dtype", None)
    return settings


def _without(data: Any, drop: frozenset[str] | set[str]) -> Any:
    if isinstance(data, Mapping):
        return {key: _without(value, drop) for key, value in data.items() if key not in drop}
    return data


def data_inputs(data: Any) -> dict[str, Any]:
    """The annotation file (or folder of annotation files) of a data set config or test-set mapping, and what the
    data set says identifies its content besides (`pacs.captioner.orchestration.data_sources.DataSource.content`)."""
    mapping = data_mapping(data)
    path = mapping.get("path", "")
    if not path:
        return {}
    source = data_source(mapping.get("name", ""))
    inputs = {"annotations": file_input(source.path_of(path))}
    if source.content is not None:
        inputs["content"] = source.content(mapping)
    return inputs


def source_inputs(runner: StageRunner, source: Any) -> dict[str, Any]:
    """The checkpoint (sha256) and architecture file of a backbone source, when it names them."""
    record = dataclasses.asdict(source) if dataclasses.is_dataclass(source) else dict(source)
    inputs: dict[str, Any] = {}
    if record.get("checkpoint"):
        inputs["checkpoint"] = runner.checkpoint(record["checkpoint"])
    if record.get("arch") and Path(record["arch"]).expanduser().is_file():
        inputs["arch"] = file_input(record["arch"])
    return inputs


def reward_model_inputs(runner: StageRunner, reward_models: Any) -> dict[str, Any]:
    """Checkpoint inputs of every reward model (`reward_models.clip`, `.pac`, and any other source in it)."""
    inputs = {}
    for field in dataclasses.fields(reward_models):
        value = getattr(reward_models, field.name)
        if dataclasses.is_dataclass(value):
            found = source_inputs(runner, value)
            if found:
                inputs[field.name] = found
    return inputs
