"""The pipeline's rewards: one model per contrastive family (`reward_models`), checked before any work."""
from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from pacs.captioner.modeling.scst_guards import anchored_reward_spec
from pacs.captioner.orchestration.backbone_source import BackboneSource, load_source_backbone, resolve_device
from pacs.captioner.orchestration.data_sources import data_mapping, data_source
from pacs.captioner.orchestration.pipeline_config import GUARD_REWARDS, REWARD_MODEL_SLOTS, PipelineConfig
from pacs.metric.common.errors import InputError

logger = logging.getLogger(__name__)


def reward_context(config: PipelineConfig, dataset_references: dict[str, list[str]],
                   image_paths: dict[str, Any], spec: str | None = None) -> dict[str, Any]:
    """The `build_reward` context of a pipeline: training references, image paths, reward models, the guard
    rewards' options, the contrastive rewards' `score` / `long_captions` (`contrastive_reward`) and what the data
    set's own rewards read (`pacs.captioner.orchestration.data_sources`).

    With `spec`, only the reward models its contrastive terms use are loaded (none for `cider`)."""
    context: dict[str, Any] = {"train_references": dataset_references, "image_paths": image_paths,
                               "device": resolve_device(config.reward_models.device),
                               **config.reward_guards.context(), **config.contrastive_reward.context()}
    source = data_source(config.data.name)
    if source.reward_context is not None:  # what the data set's own rewards read (the demo world's scenes: judge)
        context.update(source.reward_context(data_mapping(config.data)))
    from pacs.captioner.orchestration.preflight import reward_slots
    from pacs.metric.scoring.registry import METRICS

    scorers = reward_scorers(config, None if spec is None else reward_slots([spec]))
    if scorers:  # each contrastive reward gets the model of its own family's slot
        context["scorers"] = {name: scorers[spec.family] for name, spec in METRICS.items() if spec.family in scorers}
    return context


def _source_given(source: BackboneSource) -> bool:
    return bool(source.backbone or source.checkpoint or source.random_config)


def check_reward_models(config: PipelineConfig) -> None:
    """Config error, before any work, when a contrastive reward's family has no model in `reward_models`."""
    from pacs.metric.scoring.registry import METRICS
    from pacs.rewards.registry import parse_reward_spec

    slots = dict(REWARD_MODEL_SLOTS)
    for spec in config.rewards:
        for name, _ in parse_reward_spec(spec):
            if name not in METRICS:
                continue
            family = METRICS[name].family
            if not _source_given(getattr(config.reward_models, slots[family])):
                raise InputError(f"rewards: {spec!r} needs a {family} model: set reward_models.{slots[family]} "
                                 f"(reward_models.pac is the PAC-S++ model, reward_models.pacs the PAC-S model)")


def guard_reward_settings(config: PipelineConfig, spec: str) -> dict[str, Any]:
    """The reward options a spec's SCST stage fingerprint records: `{"reward_guards": ...}` for a spec with a guard
    reward (`rep-penalty`, `length-penalty`), plus `{"contrastive_reward": ...}` (only the keys off their
    defaults) for a spec with a contrastive term; nothing else, so run folders made before these keys existed
    stay done."""
    import dataclasses

    from pacs.metric.scoring.registry import METRICS
    from pacs.rewards.registry import parse_reward_spec

    names = [name for name, _ in parse_reward_spec(spec)]
    settings: dict[str, Any] = {}
    if any(name in GUARD_REWARDS for name in names):
        settings["reward_guards"] = dataclasses.asdict(config.reward_guards)
    changed = config.contrastive_reward.changed()
    if changed and any(name in METRICS for name in names):
        settings["contrastive_reward"] = changed
    return settings


def build_pipeline_reward(spec: str, config: PipelineConfig, dataset_references: dict[str, list[str]],
                          image_paths: dict[str, Any]) -> Any:
    """`pacs.rewards.build_reward(spec, **reward_context(...))`, with `scst.cider_anchor`'s CIDEr-D term added."""
    from pacs.rewards import build_reward

    spec = anchored_reward_spec(spec, config.scst.cider_anchor)
    return build_reward(spec, **reward_context(config, dataset_references, image_paths, spec))


def reward_scorers(config: PipelineConfig, slots: Iterable[str] | None = None) -> dict[str, Any]:
    """Scorers keyed by family ('clip', 'pac-s', 'pac-s++') for the `reward_models` slots the config sets (only
    those among `slots` when given: `clip`, `pacs`, `pac`).

    A model whose established family contradicts its slot raises `FamilyMismatchError` naming the slot
    (unless `reward_models.allow_family_mismatch`).
    """
    from pacs.metric.models.families import FamilyMismatchError
    from pacs.metric.scoring.scorer import Scorer

    scorers = {}
    models = config.reward_models
    for family, slot in REWARD_MODEL_SLOTS:
        source = getattr(models, slot)
        if _source_given(source) and (slots is None or slot in slots):
            device = resolve_device(models.device)
            backbone = load_source_backbone(source, device)
            if backbone.family is not None and backbone.family != family:
                message = (f"reward_models.{slot} must be a {family} model, but {backbone.name} is {backbone.family} "
                           f"(established by {backbone.family_source})")
                if not models.allow_family_mismatch:
                    raise FamilyMismatchError(f"{message}; set reward_models.allow_family_mismatch=true to use it")
                logger.warning("%s (reward_models.allow_family_mismatch)", message)
            logger.info("reward_models.%s: %s (family %s: %s)", slot, backbone.name, backbone.family or "unknown",
                        backbone.family_source)
            scorers[family] = Scorer(backbone, device=device, dtype=models.dtype, workers=models.workers)
    return scorers
