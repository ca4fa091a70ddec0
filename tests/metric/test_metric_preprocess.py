"""Image preprocessing in the official order, for every image mode; bit-identical to the official pixels."""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch
from PIL import Image

from pacs.metric.common.errors import InputError
from pacs.metric.models.preprocess import OPENAI_MEAN, OPENAI_STD, ImagePreprocess, open_image


def _official_by_hand(image: Image.Image, size: int) -> torch.Tensor:
    """PIL resize of the shorter side (BICUBIC), center crop with rounded offsets, then RGB, /255, normalise."""
    width, height = image.size
    if width <= height:
        new = (size, int(size * height / width))
    else:
        new = (int(size * width / height), size)
    resized = image.resize(new, Image.BICUBIC)
    left, top = round((new[0] - size) / 2), round((new[1] - size) / 2)
    cropped = resized.crop((left, top, left + size, top + size)).convert("RGB")
    pixels = torch.from_numpy(np.asarray(cropped, dtype=np.float32) / 255).permute(2, 0, 1)
    return (pixels - torch.tensor(OPENAI_MEAN)[:, None, None]) / torch.tensor(OPENAI_STD)[:, None, None]


def test_fixture_pixels_are_bit_identical(pacscore_fixtures):
    expected = json.loads((pacscore_fixtures / "A" / "expected.json").read_text())["preprocessed_pixels"]
    preprocess = ImagePreprocess()
    for name, facts in expected.items():
        pixels = preprocess(open_image(pacscore_fixtures / "inputs" / "images" / name))
        assert tuple(pixels.shape) == tuple(facts["shape"])
        digest = hashlib.sha256(pixels.numpy().astype(np.float32).tobytes()).hexdigest()
        assert digest == facts["float32_sha256"], name


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "LA", "P", "CMYK", "1"])
def test_every_mode_follows_the_official_order(mode):
    rng = np.random.default_rng(1)
    base = Image.fromarray(rng.integers(0, 256, size=(50, 70, 3), dtype=np.uint8))
    image = base.convert(mode) if mode != "P" else base.quantize(16)
    pixels = ImagePreprocess(size=32)(image)
    assert pixels.shape == (3, 32, 32) and pixels.dtype == torch.float32
    assert torch.allclose(pixels, _official_by_hand(image, 32), atol=1e-6)


def test_palette_is_resized_before_conversion():
    rng = np.random.default_rng(2)
    image = Image.fromarray(rng.integers(0, 256, size=(61, 45, 3), dtype=np.uint8)).quantize(8)
    ours = ImagePreprocess(size=32)(image)
    convert_first = ImagePreprocess(size=32)(image.convert("RGB"))
    assert not torch.allclose(ours, convert_first, atol=1e-3)  # the order matters for palette images


def test_alpha_is_dropped():
    rng = np.random.default_rng(3)
    rgb = rng.integers(0, 256, size=(40, 40, 3), dtype=np.uint8)
    alpha = rng.integers(0, 256, size=(40, 40, 1), dtype=np.uint8)
    rgba = Image.fromarray(np.concatenate([rgb, alpha], axis=-1), mode="RGBA")
    assert torch.allclose(ImagePreprocess(size=40)(rgba), ImagePreprocess(size=40)(Image.fromarray(rgb)), atol=1e-6)


def test_sixteen_bit_images_are_scaled_to_eight_bits(tmp_path):
    rng = np.random.default_rng(4)
    eight = rng.integers(0, 256, size=(30, 50), dtype=np.uint8)
    path = tmp_path / "deep.png"
    Image.fromarray(eight.astype(np.uint16) * 257).save(path)
    sixteen = open_image(path)
    assert sixteen.mode.startswith("I")
    ours = ImagePreprocess(size=24)(sixteen)
    assert torch.allclose(ours, ImagePreprocess(size=24)(Image.fromarray(eight, mode="L")), atol=1e-6)


def test_exif_orientation_is_not_applied(tmp_path):
    rng = np.random.default_rng(5)
    image = Image.fromarray(rng.integers(0, 256, size=(40, 60, 3), dtype=np.uint8))
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW" when honoured
    rotated_tag, plain = tmp_path / "tag.png", tmp_path / "plain.png"
    image.save(rotated_tag, exif=exif)
    image.save(plain)
    assert open_image(rotated_tag).getexif().get(0x0112) == 6
    preprocess = ImagePreprocess(size=32)
    assert torch.equal(preprocess(open_image(rotated_tag)), preprocess(open_image(plain)))


def test_unreadable_files_name_the_path(tmp_path):
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    with pytest.raises(InputError, match="broken.png"):
        open_image(broken)
    with pytest.raises(InputError, match="not found: .*absent.jpg"):
        open_image(tmp_path / "absent.jpg")
