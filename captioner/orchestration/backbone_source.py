"""Where grid features come from: a YAML-friendly description of a CLIP backbone, stored in every captioner
checkpoint so that `pacs caption` re-creates exactly the feature extractor the captioner was trained on."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pacs.metric.common.config import Seed
from pacs.metric.common.errors import InputError


@dataclass
class BackboneSource:
    """An open_clip `NAME[/PRETRAINED]`, a checkpoint file (+ optional arch), or a seeded tiny random CLIP.

    `arch` is an architecture FILE or preset (`openai`, `openclip-laion`), as `--arch`; `family` is the
    checkpoint's family (clip, pac-s, pac-s++) where nothing in the file establishes it, as `--family`.
    """

    backbone: str = "ViT-B-32/openai"
    checkpoint: str = ""
    arch: str = ""
    random_config: dict[str, Any] = field(default_factory=dict)
    random_seed: Seed = 0
    device: str = "auto"
    family: str = ""

    def to_record(self) -> dict[str, Any]:
        """The fields stored in `captioner.json` (no device; `family` only when set)."""
        record = {"backbone": self.backbone, "checkpoint": self.checkpoint, "arch": self.arch,
                  "random_config": self.random_config, "random_seed": self.random_seed}
        if self.family:
            record["family"] = self.family
        return record


def resolve_device(device: str | None) -> str:
    """`auto` (or None) -> this process's accelerate device (cuda:<local rank>, mps or cpu); others checked
    (`pacs.metric.common.device.resolve_device`: an unknown device or `cuda` without a GPU is an InputError)."""
    from pacs.metric.common.device import resolve_device as resolve

    return resolve(device)


def load_source_backbone(source: BackboneSource | Mapping[str, Any], device: str | None = None) -> Any:
    """Build the `pacs.metric.models.backbones.Backbone` a source describes (a random one has the family `source.family`)."""
    import dataclasses

    from pacs.metric.models.backbones import build_backbone_from_config
    from pacs.metric.models.factory import load_backbone
    from pacs.metric.models.families import NOT_ESTABLISHED, SOURCE_USER, check_family_name

    if not isinstance(source, BackboneSource):
        known = {key: source[key] for key in ("backbone", "checkpoint", "arch", "random_config", "random_seed",
                                              "family") if key in source}
        source = BackboneSource(**known)
    device = resolve_device(device or source.device)
    family = check_family_name(source.family, "family")
    if source.random_config:
        built = build_backbone_from_config(dict(source.random_config), seed=int(source.random_seed),
                                           name="tiny-random", device=device)
        return dataclasses.replace(built, family=family, family_source=SOURCE_USER if family else NOT_ESTABLISHED)
    if not source.backbone and not source.checkpoint:
        raise InputError("no feature backbone: set features.backbone (open_clip NAME[/PRETRAINED]) or "
                         "features.checkpoint")
    return load_backbone(backbone=source.backbone or None, checkpoint=source.checkpoint or None,
                         arch=source.arch or None, device=device, family=family)
