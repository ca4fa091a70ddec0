"""Where grid features come from: a YAML-friendly description of a CLIP backbone, stored in every captioner
checkpoint so that `pacs caption` re-creates exactly the feature extractor the captioner was trained on."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from metric.common.errors import InputError


@dataclass
class BackboneSource:
    """An open_clip `NAME[/PRETRAINED]`, a checkpoint file (+ optional arch), or a seeded tiny random CLIP."""

    backbone: str = "ViT-B-32/openai"
    checkpoint: str = ""
    arch: str = ""
    random_config: dict[str, Any] = field(default_factory=dict)
    random_seed: int = 0
    device: str = "auto"

    def to_record(self) -> dict[str, Any]:
        """The fields stored in `captioner.json` (no device)."""
        return {"backbone": self.backbone, "checkpoint": self.checkpoint, "arch": self.arch,
                "random_config": self.random_config, "random_seed": self.random_seed}


def resolve_device(device: str | None) -> str:
    """`auto` (or None) -> this process's accelerate device (cuda:<local rank>, mps or cpu); others unchanged."""
    if device in (None, "", "auto"):
        from captioner.training import process_state

        return str(process_state().device)
    return str(device)


def load_source_backbone(source: BackboneSource | Mapping[str, Any], device: str | None = None) -> Any:
    """Build the `metric.backbones.Backbone` a source describes."""
    from metric.backbones import build_backbone_from_config, load_backbone

    if not isinstance(source, BackboneSource):
        known = {key: source[key] for key in ("backbone", "checkpoint", "arch", "random_config", "random_seed")
                 if key in source}
        source = BackboneSource(**known)
    device = resolve_device(device or source.device)
    if source.random_config:
        return build_backbone_from_config(dict(source.random_config), seed=int(source.random_seed),
                                          name="tiny-random", device=device)
    if not source.backbone and not source.checkpoint:
        raise InputError("no feature backbone: set features.backbone (open_clip NAME[/PRETRAINED]) or "
                         "features.checkpoint")
    return load_backbone(backbone=source.backbone or None, checkpoint=source.checkpoint or None,
                         arch=source.arch or None, device=device)
