"""Image reading and the CLIP preprocessing in the official order: resize + crop first, then RGB, tensor, normalise.

The official PAC-S code passes the PIL image as opened (no convert) to torchvision's transform, whose last step
before `ToTensor` is `convert("RGB")`. Resizing therefore happens in the image's own mode: palette and 1-bit
images are resized by PIL with NEAREST whatever interpolation is asked for, RGBA keeps its alpha until the
convert drops it. EXIF orientation is not applied. 16-bit images are scaled to 8 bits first (value / 257,
rounded), since neither PIL nor torchvision resizes them to an 8-bit RGB result otherwise.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torchvision import transforms
from torchvision.transforms import InterpolationMode

from pacs.metric.common.errors import InputError
from pacs.metric.models.normalisation import OPENAI_MEAN, OPENAI_STD

_INTERPOLATIONS = {
    "bicubic": InterpolationMode.BICUBIC,
    "bilinear": InterpolationMode.BILINEAR,
    "nearest": InterpolationMode.NEAREST,
}
_SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")


def open_image(path: str | os.PathLike) -> Image.Image:
    """Open an image file fully decoded (no convert, no EXIF rotation); InputError naming the file otherwise."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"image file not found: {path}")
    try:
        with Image.open(path) as handle:
            handle.load()
            image = handle.copy()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        raise InputError(f"cannot read image {path}: {error}") from None
    return image


def to_eight_bit(image: Image.Image) -> Image.Image:
    """Scale a 16-bit (or 32-bit integer) grayscale image to 8-bit mode "L"; other images are returned as is."""
    if image.mode not in _SIXTEEN_BIT_MODES:
        return image
    values = np.asarray(image, dtype=np.float64)
    scaled = np.clip(np.rint(values / 257.0), 0, 255).astype(np.uint8)
    return Image.fromarray(scaled, mode="L")


def _convert_rgb(image: Image.Image) -> Image.Image:
    return image.convert("RGB")


@dataclass
class ImagePreprocess:
    """PIL image -> FloatTensor[3, H, W], the official order: resize (shorter side), center crop, RGB, normalise."""

    size: int = 224
    mean: Sequence[float] = OPENAI_MEAN
    std: Sequence[float] = OPENAI_STD
    interpolation: str = "bicubic"
    resize_mode: str = "shortest"
    _transform: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.interpolation not in _INTERPOLATIONS:
            raise InputError(f"unknown interpolation {self.interpolation!r} (known: {', '.join(_INTERPOLATIONS)})")
        mode = _INTERPOLATIONS[self.interpolation]
        if self.resize_mode == "shortest":
            geometry = [transforms.Resize(self.size, interpolation=mode), transforms.CenterCrop(self.size)]
        elif self.resize_mode == "squash":
            geometry = [transforms.Resize((self.size, self.size), interpolation=mode)]
        else:
            raise InputError(f"unsupported resize_mode {self.resize_mode!r} (supported: shortest, squash)")
        self.mean = tuple(float(v) for v in self.mean)
        self.std = tuple(float(v) for v in self.std)
        self._transform = transforms.Compose(
            [*geometry, _convert_rgb, transforms.ToTensor(), transforms.Normalize(self.mean, self.std)]
        )

    @classmethod
    def from_open_clip_cfg(cls, cfg: Mapping[str, Any]) -> ImagePreprocess:
        """Build from an open_clip preprocess config (`size`, `mean`, `std`, `interpolation`, `resize_mode`)."""
        size = cfg.get("size", 224)
        if isinstance(size, (tuple, list)):
            if len(set(size)) != 1:
                raise InputError(f"non-square image size {tuple(size)} is not supported")
            size = size[0]
        return cls(
            size=int(size),
            mean=tuple(cfg.get("mean") or OPENAI_MEAN),
            std=tuple(cfg.get("std") or OPENAI_STD),
            interpolation=cfg.get("interpolation") or "bicubic",
            resize_mode=cfg.get("resize_mode") or "shortest",
        )

    def config(self) -> dict[str, Any]:
        """Return the settings as a plain dict (for provenance and saved checkpoints)."""
        return {"size": self.size, "mean": list(self.mean), "std": list(self.std),
                "interpolation": self.interpolation, "resize_mode": self.resize_mode}

    def __call__(self, image: Image.Image) -> torch.Tensor:
        """Preprocess one PIL image."""
        return self._transform(to_eight_bit(image))
