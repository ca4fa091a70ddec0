"""The Scorer's cheaper input side (issue 30) gives the bits of the path it replaced.

- repeated images are keyed once (`image_sources.image_keys`): the keys equal `image_key` of each image;
- the Scorer's embeddings of repeated images equal the towers run by hand on torchvision's pixels in the same
  batches, and its scores equal a Scorer given those pixels as tensors (and the official per-pair way to rounding).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torchvision import transforms

from pacs.metric.models.normalisation import OPENAI_MEAN, OPENAI_STD
from pacs.metric.models.preprocess import open_image
from pacs.metric.scoring.image_sources import image_key, image_keys
from pacs.metric.scoring.scorer import Scorer
from pacs.metric.scoring.scores import cosine


def _torchvision(size: int, mean, std) -> transforms.Compose:
    """The pipeline as it was: torchvision's resize, crop, convert, ToTensor and Normalize."""
    return transforms.Compose([transforms.Resize(size, interpolation=transforms.InterpolationMode.BICUBIC),
                               transforms.CenterCrop(size), lambda image: image.convert("RGB"),
                               transforms.ToTensor(), transforms.Normalize(mean, std)])


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
