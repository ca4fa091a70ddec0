"""A recipe's `metric_training`: the data set's own CLIP (stage `clip`) and PAC-S++ (stage `pacs`), trained after
the data is read and before the vocabulary, on a data set that offers it (`DataSource.metric_training`: the demo
world trains them as the demo's stages of the same names).

Their checkpoints (`<run_dir>/clip/checkpoint.safetensors`, `<run_dir>/pacs/...`) are the run's feature backbone
and its CLIP-S and PAC-S++ models (`features.source`, `reward_models.clip`, `reward_models.pac`): the recipe leaves
those keys unset and `with_metric_models` points them there (the run's config.yaml records them so). Every stage
that reads them has the stage that made them as upstream (`StageRunner.makes`): a re-trained CLIP re-extracts the
features and re-runs what follows, and the dry run says so.
A stage's settings are the run's `seed`, the section's keys common to both stages (the world's: `prompt`) and its
own sub-section (`clip` or `pacs`).
"""
from __future__ import annotations

import dataclasses
from typing import Any

from pacs.captioner.orchestration.data_sources import data_mapping, data_source
from pacs.captioner.orchestration.pipeline_config import (
    METRIC_STAGES,
    PipelineConfig,
    metric_checkpoints,
    metric_sources,
    metric_training_of,
)
from pacs.captioner.orchestration.stage_fingerprints import data_inputs, settings_of

__all__ = ["METRIC_STAGES", "metric_checkpoints", "metric_stage_parts", "plan_metric_stages", "run_metric_stages",
           "with_metric_models"]


def with_metric_models(config: PipelineConfig) -> PipelineConfig:
    """`config` with the features' backbone and reward_models.clip / .pac set to the checkpoints of its
    `metric_training` stages (each keeps its device); `config` itself without `metric_training`."""
    if config.metric_training is None:
        return config
    sections: dict[str, dict[str, Any]] = {}
    for key, (given, _, _) in metric_sources(config.run_dir).items():
        section, name = key.split(".")
        device = getattr(getattr(config, section), name).device
        sections.setdefault(section, {})[name] = dataclasses.replace(given, device=device)
    return dataclasses.replace(config, **{section: dataclasses.replace(getattr(config, section), **fields)
                                          for section, fields in sections.items()})


def metric_stage_parts(config: PipelineConfig, settings: Any
                       ) -> dict[str, tuple[dict[str, Any], dict[str, Any], list[str]]]:
    """{stage: (settings, inputs, upstream)} of the `metric_training` stages (their run and their plan), `settings`
    the parsed `metric_training` section (`metric_training_of`)."""
    record = settings_of(settings)
    common = {key: value for key, value in record.items() if key not in METRIC_STAGES}
    inputs = data_inputs(config.data)  # the data set's file and what it leads to (a world's merged settings)
    return {stage: ({"seed": config.seed, **common, stage: record.get(stage, {})}, inputs, list(METRIC_STAGES[:index]))
            for index, stage in enumerate(METRIC_STAGES)}


def _data(config: PipelineConfig) -> dict[str, Any]:
    """The data set's mapping with its `path` located (a packaged world config's file)."""
    return {**data_mapping(config.data), "path": str(data_source(config.data.name).path_of(config.data.path))}


def run_metric_stages(run: Any) -> None:
    """Stages `clip` and `pacs` of a recipe run (`pacs.captioner.orchestration.shared_stages.RecipeRun`; every
    process: the trainers split their batches), when it sets `metric_training`."""
    config, stages = run.config, run.stages
    found = metric_training_of(config)
    if found is None:
        return
    training, settings = found
    data, parts = _data(config), metric_stage_parts(config, settings)
    bodies = {"clip": lambda: training.train_clip(data, settings, config.seed, stages.folder("clip")),
              "pacs": lambda: training.train_pacs(data, settings, config.seed, stages.folder("clip"),
                                                  stages.folder("pacs"))}
    for stage in METRIC_STAGES:
        settings_of_stage, inputs, upstream = parts[stage]
        stages.run(stage, bodies[stage], settings_of_stage, inputs, upstream=upstream, distributed=True)
        stages.makes(stage, metric_checkpoints(config.run_dir)[stage])


def plan_metric_stages(run: Any) -> None:
    """`plan` of stages `clip` and `pacs` (what `run_metric_stages` would decide)."""
    found = metric_training_of(run.config)
    if found is None:
        return
    for stage, (settings, inputs, upstream) in metric_stage_parts(run.config, found[1]).items():
        run.stages.plan(stage, settings, inputs, upstream=upstream)
        run.stages.makes(stage, metric_checkpoints(run.config.run_dir)[stage])

