"""The contrastive metrics: one registry, name -> MetricSpec (family, reference-based, default w)."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from pacs.metric.common.errors import InputError
from pacs.metric.common.suggest import known_hint
from pacs.metric.models.families import FamilyMismatchError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MetricSpec:
    """A contrastive metric: which backbone family it expects, whether it uses references, its default w."""

    name: str
    family: str
    reference_based: bool
    default_w: float

    @property
    def reference_free_name(self) -> str:
        """The name of the reference-free metric this one builds on (itself when reference-free)."""
        return self.name[4:] if self.reference_based else self.name


METRICS: dict[str, MetricSpec] = {
    spec.name: spec
    for spec in (
        MetricSpec("clip-s", "clip", False, 2.5),
        MetricSpec("ref-clip-s", "clip", True, 2.5),
        MetricSpec("pac-s", "pac-s", False, 2.0),
        MetricSpec("ref-pac-s", "pac-s", True, 2.0),
        MetricSpec("pac-s++", "pac-s++", False, 2.5),
        MetricSpec("ref-pac-s++", "pac-s++", True, 2.5),
    )
}

PAC_S_PLUS_PLUS_W_LARGE = 3.0  # PAC-S++ with a ViT-L/14 backbone


def metric_spec(name: str) -> MetricSpec:
    """Look a metric up by name (case-insensitive); InputError listing the known names otherwise."""
    key = str(name).strip().lower()
    if key not in METRICS:
        raise InputError(f"unknown metric {name!r} {known_hint(key, METRICS)}")
    return METRICS[key]


def is_vit_large_14(open_clip_config: dict[str, Any]) -> bool:
    """True for a ViT-L/14 vision tower (width 1024, patch 14), whatever its image size."""
    vision = open_clip_config.get("vision_cfg", {}) if open_clip_config else {}
    return vision.get("width") == 1024 and vision.get("patch_size") == 14


def default_w(name: str, backbone: Any = None) -> float:
    """Default w of a metric: CLIP-S 2.5, PAC-S 2.0, PAC-S++ 2.5 (ViT-B/32) or 3.0 (ViT-L/14)."""
    spec = metric_spec(name)
    if spec.family == "pac-s++" and backbone is not None:
        config = backbone if isinstance(backbone, dict) else getattr(backbone, "open_clip_config", {})
        if is_vit_large_14(config):
            return PAC_S_PLUS_PLUS_W_LARGE
    return spec.default_w


def check_metric_family(metric: str, backbone: Any, allow_mismatch: bool = False,
                        option: str = "--allow-family-mismatch") -> None:
    """Refuse (FamilyMismatchError) a metric whose family contradicts the backbone's established family.

    An unestablished family (None) contradicts nothing. With `allow_mismatch` the contradiction is logged.
    """
    spec = metric_spec(metric)
    family = getattr(backbone, "family", None)
    if family is None or family == spec.family:
        return
    message = (f"{spec.name} needs a {spec.family} model but {backbone.name} is a {family} checkpoint "
               f"(established by {getattr(backbone, 'family_source', '?')})")
    if not allow_mismatch:
        raise FamilyMismatchError(f"{message}; pass {option} to score it anyway")
    logger.warning("%s (%s given)", message, option)
