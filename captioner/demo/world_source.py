"""The demo world as a caption data set of the recipe pipeline: `data: {name: demo-world, path: WORLD.yaml,
image_root: FOLDER}`.

`path` is a YAML file holding the world, or a packaged config's name (`demo`, `demo_smoke`): a demo config (its
`demo.world` section, `_base_` files merged, as `pacs train --config` reads it: `demo` gives the main job's world),
a file with a `world:` section, or the world's keys at its top level (`pacs.captioner.demo.config.DemoWorldConfig`;
`{}`: the defaults). The stages fingerprint the world's merged settings, not only the file.
Its items are the world's train / val / test splits (ids `<split>-<index>`, the references as captions); the images
are rendered into `image_root` (made when missing), each one re-rendered and compared with the file there, which
is replaced when it differs, so a folder is never trusted blindly. The data set's extras
(`pacs.captioner.orchestration.data_sources`): the world's exact judge gives every test set of it the columns
Judge-acc, Judge and Halluc., its scenes are the context of the oracle reward `judge`, it makes the demo's
correlation candidates of any of its images (a recipe's `evaluation.correlation`) and it trains its own CLIP and
PAC-S++ as the demo does (a recipe's `metric_training`: `WorldMetricTrainingConfig`).
"""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pacs.captioner.data import CaptionDataset, CaptionItem, register_dataset
from pacs.captioner.demo import metric_stages
from pacs.captioner.demo.config import DemoWorldConfig, WorldMetricTrainingConfig, check_metric_fit
from pacs.captioner.demo.correlation import world_candidates
from pacs.captioner.demo.data import DemoData, render_images
from pacs.captioner.demo.judge import judge_values
from pacs.captioner.orchestration.data_sources import DataSource, MetricTraining, register_data_source
from pacs.captioner.orchestration.judge_correlation import Candidates, CorrelationConfig
from pacs.metric.common.config import from_dict, load_yaml, to_dict
from pacs.metric.common.config_files import resolve_config
from pacs.metric.common.errors import InputError

logger = logging.getLogger(__name__)

NAME = "demo-world"


def world_config(path: str | Path) -> DemoWorldConfig:
    """The world a `demo-world` file describes (its `demo.world`, `world:` or top-level keys)."""
    data = load_yaml(path)
    if "demo" in data:
        from pacs.captioner.demo.pipeline import load_demo_config  # the demo's own reading: _base_, renamed keys

        return load_demo_config(path, []).world
    section = data.get("world", data)
    if not isinstance(section, dict):
        raise InputError(f"{path}: world: expected a mapping of world settings, got {type(section).__name__}")
    return from_dict(DemoWorldConfig, section, f"{path}:world" if "world" in data else str(path))


def world_data(data: Mapping[str, Any]) -> DemoData:
    """The items of a `demo-world` data set mapping (`path`, `image_root`), nothing rendered."""
    root = data.get("image_root")
    if not root:
        raise InputError(f"data set {NAME} ({data.get('path')}): set image_root, the folder its images are rendered "
                         "into")
    if data.get("options"):
        raise InputError(f"data set {NAME}: options {sorted(data['options'])} are not read; the world's settings "
                         f"belong in its file ({data.get('path')})")
    return DemoData.build(world_config(data["path"]), Path(root))


@register_dataset(NAME)
def load_world(path: Path, image_root: Path | None = None, **options: Any) -> CaptionDataset:
    """The world of file `path` as a caption data set, its images rendered into `image_root`."""
    data = world_data({"path": str(path), "image_root": image_root, "options": options})
    written = render_images(data)
    logger.info("%s: %d images rendered into %s (the others there were already their renderings)", NAME, written,
                data.image_dir)
    items = [CaptionItem(image_id=item.image_id, image_path=data.image_path(item.image_id),
                         captions=list(item.references), split=split)
             for split, split_items in data.splits.items() for item in split_items]
    return CaptionDataset(name=NAME, items=items, source=str(path))


def world_judge(data: Mapping[str, Any]) -> Any:
    """The judge of a `demo-world` data set: `judge(image_ids, captions)` -> the judge's columns per caption."""
    scenes = world_data(data).scenes()

    def judge(image_ids: Sequence[str], captions: Sequence[str]) -> dict[str, np.ndarray]:
        missing = [image_id for image_id in image_ids if image_id not in scenes]
        if missing:
            raise InputError(f"data set {NAME} ({data.get('path')}): image {missing[0]!r} is not in its world")
        return judge_values(list(captions), [scenes[image_id] for image_id in image_ids])[0]

    return judge


def world_settings(data: Mapping[str, Any]) -> dict[str, Any]:
    """What identifies a `demo-world` data set's content in a fingerprint: the world's merged settings."""
    return {"world": to_dict(world_config(data["path"]))}


def world_reward_context(data: Mapping[str, Any]) -> dict[str, Any]:
    """What the rewards of a recipe on a `demo-world` data set read besides the references: the scenes (`judge`)."""
    return {"scenes": world_data(data).scenes()}


def world_candidates_of(data: Mapping[str, Any], image_ids: Sequence[str], settings: CorrelationConfig,
                        seed: int) -> Candidates:
    """The correlation candidates of images `image_ids` of a `demo-world` data set (the demo's, drawn with
    `seed` over those images: `pacs.captioner.demo.correlation.world_candidates`)."""
    world = world_data(data)
    items = {item.image_id: item for split in world.splits.values() for item in split}
    missing = [image_id for image_id in image_ids if image_id not in items]
    if missing:
        raise InputError(f"data set {NAME} ({data.get('path')}): image {missing[0]!r} is not in its world")
    return world_candidates([items[image_id] for image_id in image_ids], settings, seed, world.image_path)


CURVE = "history.csv"
"""The validation history of a metric stage as CSV, in its folder (the demo writes it to `logs/<stage>.csv`)."""


def world_metric_check(data: Mapping[str, Any], settings: WorldMetricTrainingConfig) -> None:
    """A recipe's `metric_training` fits the world of its `demo-world` data set (patches, batches)."""
    check_metric_fit(world_config(data["path"]), settings.clip, settings.pacs, "metric_training.")


def world_clip(data: Mapping[str, Any], settings: WorldMetricTrainingConfig, seed: int, folder: Path) -> dict:
    """Stage `clip` of a recipe on a `demo-world` data set: the demo's tiny CLIP of that world (images rendered)."""
    return metric_stages.pretrain_clip(settings.clip, world_data(data), seed, settings.prompt, folder, folder / CURVE)


def world_pacs(data: Mapping[str, Any], settings: WorldMetricTrainingConfig, seed: int, clip_folder: Path,
               folder: Path) -> dict:
    """Stage `pacs` of a recipe on a `demo-world` data set: the demo's PAC-S++ LoRA from the CLIP in `clip_folder`."""
    return metric_stages.train_pacs(settings.pacs, world_data(data), seed, settings.prompt, clip_folder, folder, folder / CURVE)


register_data_source(NAME, DataSource(judge=world_judge, reward_context=world_reward_context,
                                      makes_image_root=True, locate=resolve_config, content=world_settings,
                                      candidates=world_candidates_of,
                                      metric_training=MetricTraining(WorldMetricTrainingConfig, world_metric_check,
                                                                     world_clip, world_pacs)))
