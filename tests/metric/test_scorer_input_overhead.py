"""The Scorer's cheaper input side (issue 30) gives the bits of the path it replaced.

- `ImagePreprocess` runs torchvision's `ToTensor` + `Normalize` as the same float32 operations in numpy: compared
  with torchvision's own transforms, built here, on every uint8 value of every channel and on whole images;
- repeated images are keyed once (`image_inputs.image_keys`): the keys equal `image_key` of each image;
- the Scorer stacks its batches into one reused buffer: its embeddings equal the towers run by hand on the
  torchvision pixels in the same batches, and its scores equal a Scorer given those pixels as tensors.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms

from metric.models.normalisation import OPENAI_MEAN, OPENAI_STD
from metric.models.preprocess import ImagePreprocess, normalised_tensor, open_image, to_eight_bit
from metric.scoring.image_inputs import image_key, image_keys
from metric.scoring.scorer import Scorer
from metric.scoring.scores import cosine

SIGLIP = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def _torchvision(size: int, mean, std) -> transforms.Compose:
    """The pipeline as it was: torchvision's resize, crop, convert, ToTensor and Normalize."""
    return transforms.Compose([transforms.Resize(size, interpolation=transforms.InterpolationMode.BICUBIC),
                               transforms.CenterCrop(size), lambda image: image.convert("RGB"),
                               transforms.ToTensor(), transforms.Normalize(mean, std)])


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool((a.view(torch.int32) == b.view(torch.int32)).all())


@pytest.mark.parametrize("mean,std", [(OPENAI_MEAN, OPENAI_STD), SIGLIP, IMAGENET])
def test_every_uint8_value_of_every_channel_gives_torchvisions_float(mean, std):
    values = np.arange(256, dtype=np.uint8).reshape(16, 16)
    image = Image.fromarray(np.stack([values, values[::-1], np.roll(values, 77)], axis=-1), "RGB")
    expected = transforms.Normalize(mean, std)(transforms.ToTensor()(image))
    ours = normalised_tensor(image, np.asarray(mean, np.float32).reshape(3, 1, 1),
                             np.asarray(std, np.float32).reshape(3, 1, 1))
    assert _same_bits(ours, expected)  # elementwise: every image's pixels are these values


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "LA", "P", "CMYK", "1", "I;16"])
def test_whole_images_of_every_mode_equal_torchvisions_pipeline(mode):
    rng = np.random.default_rng(7)
    base = Image.fromarray(rng.integers(0, 256, size=(61, 83, 3), dtype=np.uint8))
    if mode == "P":
        image = base.quantize(16)
    elif mode == "I;16":
        image = Image.fromarray(rng.integers(0, 65536, size=(61, 83), dtype=np.uint16))
    else:
        image = base.convert(mode)
    for size, (mean, std) in ((32, (OPENAI_MEAN, OPENAI_STD)), (48, SIGLIP)):
        expected = _torchvision(size, mean, std)(to_eight_bit(image))
        assert _same_bits(ImagePreprocess(size=size, mean=mean, std=std)(image), expected)


def test_real_jpegs_equal_torchvisions_pipeline(shared_data: Path):
    folder = shared_data / "flickr8k" / "images"
    paths = sorted(folder.glob("*.jpg"))[:12]
    assert paths, f"no Flickr8k JPEGs under {folder}"
    for path in paths:
        image = open_image(path)
        assert _same_bits(ImagePreprocess()(image), _torchvision(224, OPENAI_MEAN, OPENAI_STD)(image)), path


def test_another_default_dtype_keeps_torchvisions_output():
    image = Image.fromarray(np.random.default_rng(3).integers(0, 256, size=(40, 50, 3), dtype=np.uint8))
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        ours = ImagePreprocess(size=32)(image)
        expected = _torchvision(32, OPENAI_MEAN, OPENAI_STD)(image)
    finally:
        torch.set_default_dtype(previous)
    assert ours.dtype == torch.float64 and torch.equal(ours, expected)


def test_repeated_images_are_keyed_as_each_alone(image_dir: Path):
    paths = sorted(str(path) for path in image_dir.iterdir())[:3]
    pil = open_image(paths[0])
    twin = pil.copy()  # another object, the same pixels: the same key
    tensor = torch.arange(12, dtype=torch.uint8).reshape(3, 2, 2)
    images = [paths[0], paths[1], paths[0], Path(paths[1]), pil, pil, twin, tensor, tensor, paths[2]]
    assert image_keys(images) == [image_key(image) for image in images]
    assert image_keys([]) == []


@pytest.mark.parametrize("workers", [0, 2])
def test_batched_embeddings_equal_the_towers_on_torchvisions_pixels(tiny_backbone, image_dir: Path, workers):
    paths = sorted(str(path) for path in image_dir.iterdir())  # 6 images: batches of 4 and 2
    pixels = [_torchvision(64, OPENAI_MEAN, OPENAI_STD)(open_image(path)) for path in paths]
    scorer = Scorer(tiny_backbone, batch_size=4, progress=False, workers=workers)
    ours = scorer.embed_images([path for path in paths for _ in range(3)])  # each image once per caption
    with torch.no_grad():
        by_hand = torch.cat([tiny_backbone.encode_image(torch.stack(pixels[start:start + 4]))
                             for start in (0, 4)])
    by_hand = torch.nn.functional.normalize(by_hand.float(), dim=-1)
    assert scorer.images_encoded == 6
    assert torch.equal(ours, by_hand.repeat_interleave(3, dim=0))


def test_scores_equal_a_scorer_given_torchvisions_pixels(tiny_backbone, image_dir: Path):
    paths = sorted(str(path) for path in image_dir.iterdir())
    captions = [f"a photo of thing {index} {word}" for index in range(len(paths)) for word in ("red", "blue")]
    images = [path for path in paths for _ in range(2)]
    pixels = {path: _torchvision(64, OPENAI_MEAN, OPENAI_STD)(open_image(path)) for path in paths}
    references = [["a reference caption", caption[::-1]] for caption in captions]
    ours = Scorer(tiny_backbone, batch_size=4, progress=False, workers=2).score(images, captions, references)
    old = Scorer(tiny_backbone, batch_size=4, progress=False, workers=0).score(
        [pixels[path] for path in images], captions, references)
    assert np.array_equal(ours.scores, old.scores) and np.array_equal(ours.cosines, old.cosines)
    with torch.no_grad():  # per pair, the official way (77-token texts, the full towers): float rounding apart
        image_emb = tiny_backbone.model.encode_image(torch.stack([pixels[path] for path in images]))
        text_emb = tiny_backbone.model.encode_text(tiny_backbone.tokenize(["A photo depicts " + c for c in captions]))
    assert np.allclose(ours.cosines, cosine(image_emb, text_emb).numpy(), atol=1e-5)
