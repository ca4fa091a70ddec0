"""The opt-in GPU image path (`--decode gpu`): JPEG decoded by nvJPEG and resized on the GPU.

The exact path (the default, `--decode cpu`) decodes with PIL and resizes with PIL's bicubic filter
(`pacs.metric.models.preprocess`), as the official PAC-S code does, so official scores reproduce. `TensorDecoder`
decodes JPEG files with `torchvision.io.decode_jpeg` on its device (nvJPEG on CUDA) and applies the same geometry
with tensor operations: bicubic resize of the shorter side with antialiasing, rounded to 8 bits as PIL's result
is, centre crop, then the backbone's normalisation. Decoder and filter differ from PIL's in their rounding, so
its pixels, embeddings and scores deviate slightly from the exact path; docs/performance.md records the deviation
measured on the shared Flickr8k images (the same algorithm on the CPU, `device="cpu"`, stands in for the GPU).
Files that are not JPEG (PNG, ...) go through the exact PIL path.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as tvf

from pacs.metric.common.errors import InputError
from pacs.metric.common.parallel import DECODES
from pacs.metric.models.preprocess import ImagePreprocess, open_image

_JPEG_MAGIC = b"\xff\xd8\xff"
_MODES = {"bicubic": InterpolationMode.BICUBIC, "bilinear": InterpolationMode.BILINEAR,
          "nearest": InterpolationMode.NEAREST}


def check_decode(decode: str, device: str | torch.device, name: str = "--decode") -> str:
    """`decode` when it can run on `device`: `gpu` needs a CUDA device (InputError in one line otherwise)."""
    if decode not in DECODES:
        raise InputError(f"{name} {decode!r}: choose one of {', '.join(DECODES)}")
    if decode == "gpu" and (torch.device(device).type != "cuda" or not torch.cuda.is_available()):
        raise InputError(f"{name} gpu needs a CUDA GPU (nvJPEG) and a cuda device, but "
                         f"{'this machine has none' if not torch.cuda.is_available() else f'the device is {device}'}"
                         f": use {name} cpu (the default, exact)")
    return decode


class TensorDecoder:
    """Image file -> preprocessed pixels `[3, H, W]` (float32, on `device`) by tensor operations.

    Follows an `ImagePreprocess`'s size, interpolation, resize mode and normalisation; a backbone with another
    kind of preprocessing is refused.
    """

    def __init__(self, preprocess: object, device: str | torch.device) -> None:
        if not isinstance(preprocess, ImagePreprocess):
            raise InputError(f"--decode gpu needs the CLIP-style preprocessing (resize, crop, normalise) of an "
                             f"open_clip or PAC-S backbone; this backbone's is {type(preprocess).__name__}: use "
                             "--decode cpu")
        self.preprocess = preprocess
        self.device = torch.device(device)
        self._mean = torch.tensor(preprocess.mean, device=self.device).view(3, 1, 1)
        self._std = torch.tensor(preprocess.std, device=self.device).view(3, 1, 1)

    def __call__(self, path: str | os.PathLike) -> torch.Tensor:
        """Preprocessed pixels of one image file (JPEG on `device`; other formats by the exact PIL path)."""
        path = Path(path)
        try:
            data = path.read_bytes()
        except OSError as error:
            raise InputError(f"cannot read image {path}: {error}") from None
        if not data.startswith(_JPEG_MAGIC):
            return self.preprocess(open_image(path)).to(self.device)
        self._check_size(path)  # the decompression-bomb limit of the exact path
        try:
            pixels = decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB,
                                 device=self.device)
        except RuntimeError as error:
            raise InputError(f"cannot read image {path}: {error}") from None
        return self.pixels(pixels)

    @staticmethod
    def _check_size(path: Path) -> None:
        """Refuse what PIL refuses as a decompression bomb (the header alone is read)."""
        open_image_header(path)

    def pixels(self, image: torch.Tensor) -> torch.Tensor:
        """Preprocess a decoded `uint8` image `[3, H, W]`: resize (antialiased, rounded to 8 bits), crop, normalise."""
        p = self.preprocess
        mode = _MODES[p.interpolation]
        size = [p.size] if p.resize_mode == "shortest" else [p.size, p.size]
        resized = tvf.resize(image.float(), size, interpolation=mode, antialias=mode != InterpolationMode.NEAREST)
        resized = resized.round_().clamp_(0, 255)
        if p.resize_mode == "shortest":
            resized = tvf.center_crop(resized, [p.size, p.size])
        return ((resized / 255.0) - self._mean) / self._std


def open_image_header(path: Path) -> None:
    """Read an image's header only; a decompression bomb or an unreadable file is one InputError naming it."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as handle:
            handle.size  # noqa: B018 (the size check runs in open)
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        raise InputError(f"cannot read image {path}: {error}") from None
