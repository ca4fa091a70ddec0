"""Which family a checkpoint belongs to (CLIP, PAC-S, PAC-S++) and how it was established: never guessed.

One table, `OFFICIAL_CHECKPOINTS`, lists the released files by exact name with their family, architecture,
activation + normalisation preset and default w. A family is established by pacs' own metadata, by LoRA keys
(PAC-S++), by an exact official file name or by the user (`--family`); otherwise it stays unestablished
(`None`) and no metric can contradict it. Activation and normalisation (`ARCH_PRESETS`) are established by
pacs metadata, an exact official file name, `--arch` (a preset name or a FILE), or an architecture with a
single official variant (ViT-B/32: always OpenAI); otherwise loading refuses and names `--arch`.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pacs.metric.common.errors import InputError
from pacs.metric.models.normalisation import OPENAI_MEAN, OPENAI_STD

logger = logging.getLogger(__name__)

FAMILIES = ("clip", "pac-s", "pac-s++")
# How PAC-S++ LoRA deltas are applied (`--lora-mode`): as the official inference does, all of them, or none.
LORA_MODES = ("official", "all", "none")
# How a family was established (Backbone.family_source); official names read "official-name:<file>".
SOURCE_METADATA = "pacs-metadata"
SOURCE_LORA = "lora-keys"
SOURCE_OFFICIAL_PREFIX = "official-name:"
SOURCE_USER = "user --family"
SOURCE_OPEN_CLIP = "open_clip pretrained weights"
SOURCE_BUILT = "built in code"
NOT_ESTABLISHED = "not established"


class FamilyMismatchError(InputError):
    """A metric (or a reward-model slot) that contradicts the established family of its checkpoint."""


@dataclass(frozen=True)
class ArchPreset:
    """Activation and image normalisation of a family of released weights (architecture from the shapes)."""

    name: str
    quick_gelu: bool
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    description: str


HALF = (0.5, 0.5, 0.5)
ARCH_PRESETS: dict[str, ArchPreset] = {
    preset.name: preset for preset in (
        ArchPreset("openai", True, OPENAI_MEAN, OPENAI_STD, "QuickGELU, OpenAI mean/std"),
        ArchPreset("openclip-laion", False, HALF, HALF, "nn.GELU, mean = std = 0.5 (open_clip laion2b)"),
    )
}


@dataclass(frozen=True)
class OfficialCheckpoint:
    """A released PAC-S / PAC-S++ file: its family, open_clip architecture, activation preset and default w."""

    file: str
    family: str
    architecture: str
    preset: str
    default_w: float


OFFICIAL_CHECKPOINTS: dict[str, OfficialCheckpoint] = {
    entry.file: entry for entry in (
        OfficialCheckpoint("clip_ViT-B-32.pth", "pac-s", "ViT-B-32", "openai", 2.0),
        OfficialCheckpoint("openClip_ViT-L-14.pth", "pac-s", "ViT-L-14", "openclip-laion", 2.0),
        OfficialCheckpoint("PAC++_clip_ViT-B-32.pth", "pac-s++", "ViT-B-32", "openai", 2.5),
        OfficialCheckpoint("PAC++_clip_ViT-L-14.pth", "pac-s++", "ViT-L-14", "openai", 3.0),
    )
}
# The fields of an open_clip config that tell two ViT CLIP architectures apart.
_ARCH_FIELDS = (("embed_dim",), ("vision_cfg", "width"), ("vision_cfg", "layers"), ("vision_cfg", "patch_size"),
                ("vision_cfg", "image_size"), ("text_cfg", "width"), ("text_cfg", "layers"))


def official_checkpoint(file_name: str) -> OfficialCheckpoint | None:
    """The table entry of an exact official file name (case-sensitive, no prefix matching), else None."""
    return OFFICIAL_CHECKPOINTS.get(file_name)


def _field(config: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = config
    for key in path:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def architecture_name(config: Mapping[str, Any]) -> str | None:
    """The official architecture (open_clip name) whose dimensions `config` has, else None."""
    import open_clip

    for name in sorted({entry.architecture for entry in OFFICIAL_CHECKPOINTS.values()}):
        reference = open_clip.get_model_config(name) or {}
        if all(_field(config, path) == _field(reference, path) for path in _ARCH_FIELDS):
            return name
    return None


def single_variant_preset(architecture: str | None) -> ArchPreset | None:
    """The preset of an architecture whose official files all share one activation/normalisation, else None."""
    presets = {entry.preset for entry in OFFICIAL_CHECKPOINTS.values() if entry.architecture == architecture}
    return ARCH_PRESETS[presets.pop()] if len(presets) == 1 else None


def arch_preset(value: str | None) -> ArchPreset | None:
    """The `--arch` preset named `value` (case-insensitive), or None when `value` is not a preset name."""
    return ARCH_PRESETS.get(str(value).strip().lower()) if value else None


def check_family_name(family: str | None, option: str = "--family") -> str | None:
    """Validate a user-given family name (None / '' stay None)."""
    if not family:
        return None
    key = str(family).strip().lower()
    if key not in FAMILIES:
        raise InputError(f"{option} {family!r}: unknown family (known: {', '.join(FAMILIES)})")
    return key


def establish_family(file_name: str, has_lora: bool, user_family: str | None) -> tuple[str | None, str]:
    """(family, how it was established) of a state-dict file: LoRA keys, exact official name, then --family.

    A user `--family` that contradicts the LoRA keys or the official name is an InputError.
    """
    user_family = check_family_name(user_family)
    evidence: list[tuple[str, str]] = []
    if has_lora:
        evidence.append(("pac-s++", SOURCE_LORA))
    official = official_checkpoint(file_name)
    if official is not None:
        evidence.append((official.family, SOURCE_OFFICIAL_PREFIX + official.file))
    if len({family for family, _ in evidence}) > 1:
        raise InputError(f"{file_name}: its {evidence[0][1]} say {evidence[0][0]} but {evidence[1][1]} says "
                         f"{evidence[1][0]}: rename the file")
    if evidence:
        family, source = evidence[0]
        if user_family is not None and user_family != family:
            raise FamilyMismatchError(f"family= {user_family} contradicts {file_name}: it is a {family} checkpoint "
                                      f"({source})", parameter="family")
        return family, source
    if user_family is not None:
        return user_family, SOURCE_USER
    return None, NOT_ESTABLISHED


def check_declared_family(family: str | None, family_source: str, user_family: str | None, name: str) -> None:
    """Raise FamilyMismatchError when `--family` contradicts a family established otherwise (e.g. metadata)."""
    user_family = check_family_name(user_family)
    if user_family is not None and family is not None and user_family != family:
        raise FamilyMismatchError(f"family= {user_family} contradicts {name}: it is a {family} model "
                                  f"({family_source})", parameter="family")
