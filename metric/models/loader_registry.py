"""The family-loader protocol behind `load_backbone`: each backbone family (or pacs format) is one loader.

A loader says whether a request is its own (`detect`) and builds the `Backbone` (model, tokenizer, preprocessing,
traits, identity) for it (`build`). `pacs.metric.models.factory.FAMILY_LOADERS` lists them in order; the first whose
`detect` is true builds. `detect` looks only at names, file names and small metadata (a config file, safetensors
metadata) and may raise the one-line error of a file of its own format that is broken.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pacs.metric.models.backbones import Backbone


@dataclass(frozen=True)
class LoadRequest:
    """What `load_backbone` was asked: ``backbone=`` (a name), ``checkpoint=`` (an existing path), arch, LoRA, family."""

    backbone: str | None = None
    checkpoint: Path | None = None
    arch: str | None = None
    lora_mode: str = "official"
    family: str | None = None


class FamilyLoader(Protocol):
    """One backbone family (or pacs format): recognises its requests and builds their `Backbone`."""

    name: str

    def detect(self, request: LoadRequest) -> bool:
        """True when `request` is this loader's to build."""
        ...

    def build(self, request: LoadRequest, device: str) -> Backbone:
        """The backbone of `request` on `device` (fp32, eval mode)."""
        ...


def select_loader(request: LoadRequest, loaders: Sequence[FamilyLoader]) -> FamilyLoader | None:
    """The first loader of `loaders` that detects `request`, else None."""
    return next((loader for loader in loaders if loader.detect(request)), None)
