"""What the scorer accepts as an image, how it identifies it (cache key) and how it turns it into pixels.

- a path (`str` / `os.PathLike`): read as the official code reads files; key `path:<realpath>|<size>|<mtime_ns>`;
- a PIL image: preprocessed by the backbone; key `pil:<sha256 of mode, size and pixels>`;
- a `uint8` tensor `[C, H, W]` (C = 1 or 3, values 0..255): a raw image, turned into a PIL image and
  preprocessed by the backbone exactly as a file would be;
- a floating-point tensor `[3, H, W]`: pixels ALREADY preprocessed by the backbone's own preprocessing
  (resized, cropped, normalised: what `backbone.preprocess(pil)` returns), encoded as they are; the shape
  must be the model's input shape.
Tensors are keyed by content, `tensor:<sha256 of dtype, shape and bytes>`, never by the object's id. (The
torchmetrics classes keep torchmetrics' own convention instead: float tensors there hold raw 0..1 images.)
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image

from pacs.metric.common.errors import InputError
from pacs.metric.models.preprocess import open_image
from pacs.metric.scoring.embedding_cache import image_identity


def tensor_key(tensor: torch.Tensor) -> str:
    """`tensor:<sha256>` of a tensor's dtype, shape and bytes (CPU, contiguous): its content, not its id."""
    data = tensor.detach().to("cpu").contiguous()
    digest = hashlib.sha256(f"{data.dtype}|{tuple(data.shape)}".encode())
    digest.update(data.reshape(-1).view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    return f"tensor:{digest.hexdigest()}"


def image_key(image: Any) -> str:
    """The identity of an image: path + size + mtime of a file, sha256 of a PIL image's or a tensor's content."""
    if isinstance(image, (str, os.PathLike)):
        return image_identity(image)
    if isinstance(image, Image.Image):
        digest = hashlib.sha256(f"{image.mode}|{image.size}".encode())
        digest.update(image.tobytes())
        return f"pil:{digest.hexdigest()}"
    if isinstance(image, torch.Tensor):
        return tensor_key(image)
    raise InputError(f"an image must be a path, a PIL image or a tensor ([C, H, W] uint8, or [3, H, W] float "
                     f"already preprocessed), got {type(image).__name__}")


def image_keys(images: Sequence[Any]) -> list[str]:
    """`image_key` of every image; a path string (or the same PIL image / tensor object) repeated in `images` is
    keyed once: hashing a 480x360 image costs ~0.3 ms, and a caller often passes each image once per caption."""
    known: dict[tuple[str, Any], str] = {}
    keys = []
    for image in images:  # the objects are alive for the whole loop, so their ids are unique and stable
        token = ("path", os.fspath(image)) if isinstance(image, (str, os.PathLike)) else ("object", id(image))
        key = known.get(token)
        if key is None:
            key = known[token] = image_key(image)
        keys.append(key)
    return keys


def uint8_tensor_to_pil(image: torch.Tensor) -> Image.Image:
    """A raw `uint8` image tensor `[C, H, W]` (C = 1 or 3) as a PIL image (L or RGB)."""
    if image.ndim != 3 or image.shape[0] not in (1, 3):
        raise InputError(f"a uint8 image tensor must be [C, H, W] with C = 1 or 3, got {list(image.shape)}")
    array = image.detach().to("cpu").permute(1, 2, 0).numpy()
    return Image.fromarray(array[:, :, 0] if array.shape[2] == 1 else np.ascontiguousarray(array))


def tensor_pixels(image: torch.Tensor, expected_shape: Callable[[], tuple[int, ...]]) -> torch.Tensor:
    """The float32 pixels of a preprocessed float tensor, checked against the model's input shape."""
    shape = tuple(expected_shape())
    if tuple(image.shape) != shape:
        raise InputError(f"a float image tensor is taken as already preprocessed pixels of shape {list(shape)} "
                         f"(the backbone's preprocessing output), got {list(image.shape)}; pass a uint8 "
                         f"[C, H, W] tensor or a PIL image to have it preprocessed")
    pixels = image.detach().to("cpu", torch.float32)
    if not torch.isfinite(pixels).all():
        raise InputError("a float image tensor holds NaN or infinite values")
    return pixels


def load_pixels(image: Any, preprocess: Callable[[Any], torch.Tensor],
                expected_shape: Callable[[], tuple[int, ...]]) -> torch.Tensor:
    """Preprocessed pixels `[3, H, W]` of one image (path, PIL image, uint8 or preprocessed float tensor)."""
    if isinstance(image, torch.Tensor):
        if image.is_floating_point():
            return tensor_pixels(image, expected_shape)
        if image.dtype != torch.uint8:
            raise InputError(f"unsupported image tensor dtype {image.dtype}: pass uint8 (0..255, raw image) or "
                             f"float (already preprocessed pixels)")
        image = uint8_tensor_to_pil(image)
    pil = image if isinstance(image, Image.Image) else open_image(image)
    try:
        return preprocess(pil)
    except (OSError, ValueError) as error:
        where = "a PIL image" if isinstance(image, Image.Image) else image
        raise InputError(f"cannot preprocess image {where}: {error}") from None
