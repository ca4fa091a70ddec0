"""A recipe's `correlation/<set>` stages (`evaluation.correlation`): on every test set whose data set makes
candidates with a judge (`DataSource.candidates`: the demo world), the demo's correlation stage — candidates of
the set's first `n_images` images, drawn with the run's `seed`, scored by the evaluation's CLIP-S / PAC-S++ models
(`evaluation.contrastive_models`) and the text metrics, Kendall τ of each against the judge, the paired bootstrap of
τb(PAC-S++) − τb(CLIP-S) (`pacs.captioner.orchestration.judge_correlation`). No model, no upstream stage.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pacs.captioner.orchestration.data_sources import data_source
from pacs.captioner.orchestration.judge_correlation import correlate
from pacs.captioner.orchestration.stage_fingerprints import data_inputs, reward_model_inputs, reward_model_settings
from pacs.metric.common.config import to_dict
from pacs.metric.common.errors import InputError

__all__ = ["check_correlation", "correlation_sets", "correlation_stage_parts", "run_correlation_stage"]


def correlation_sets(config: Any) -> list[str]:
    """The test sets a recipe correlates the metrics on: those whose data set makes candidates (none without
    `evaluation.correlation`)."""
    if config.evaluation.correlation is None:
        return []
    return [name for name, test_set in config.evaluation.test_sets.items()
            if data_source(test_set.get("name", "")).candidates is not None]


def check_correlation(config: Any) -> None:
    """Refuse `evaluation.correlation` when no test set's data set can make candidates with a judge."""
    if config.evaluation.correlation is not None and not correlation_sets(config):
        names = ", ".join(f"{name} ({test_set.get('name')})" for name, test_set in config.evaluation.test_sets.items())
        raise InputError(f"evaluation.correlation: no test set's data set makes candidates with a judge (test sets: "
                         f"{names or 'none'}; data set demo-world does); remove evaluation.correlation or add such a "
                         "test set")


def correlation_stage_parts(config: Any, stages: Any, set_name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The settings and inputs of stage `correlation/<set>`."""
    e, set_config = config.evaluation, config.evaluation.test_sets[set_name]
    return ({"test_set": set_config, "correlation": to_dict(e.correlation), "seed": config.seed,
             "max_images": e.max_images, "contrastive_models": e.contrastive_models,
             "reward_models": reward_model_settings(config.reward_models)},
            {**data_inputs(set_config), **reward_model_inputs(stages, config.reward_models)})


def run_correlation_stage(config: Any, set_name: str, items: Sequence[Any], scorers: Callable[[], dict[str, Any]],
                          folder: Path) -> dict[str, Any]:
    """The work of stage `correlation/<set>` on the test set's `items` (`scorers()`: the evaluation's models by
    family), into `folder`."""
    settings, set_config = config.evaluation.correlation, config.evaluation.test_sets[set_name]
    image_ids = [item.image_id for item in items[: settings.n_images]]
    candidates = data_source(set_config.get("name", "")).candidates(set_config, image_ids, settings, config.seed)
    return correlate(candidates, scorers(), folder, settings, config.seed)
