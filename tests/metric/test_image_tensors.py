"""Images as tensors on every surface: uint8 `[C, H, W]` (raw pixels) and float `[3, H, W]` (preprocessed).

Expected values come from the PIL image the tensor holds, scored through the same model; cache identity is the
tensor's content (a content hash), never the Python object.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from pacs.metric import score
from pacs.metric.common.errors import InputError
from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config
from pacs.metric.scoring.image_sources import image_key
from pacs.metric.scoring.scorer import Scorer


@pytest.fixture(scope="module")
def backbone():
    """The tiny random CLIP."""
    return build_backbone_from_config(tiny_clip_config(), seed=4, name="tiny-tensors")


def picture(seed: int, size: tuple[int, int] = (70, 50)) -> Image.Image:
    """A random RGB PIL image."""
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8))


def as_uint8(image: Image.Image) -> torch.Tensor:
    """The `[3, H, W]` uint8 tensor of a PIL image."""
    return torch.from_numpy(np.array(image)).permute(2, 0, 1).contiguous()


def test_uint8_and_preprocessed_float_tensors_score_as_the_pil_image(backbone):
    pil = picture(0)
    captions = ["a noisy picture", "a dog"]
    expected = Scorer(backbone, progress=False).score([pil, pil], captions)
    for image in (as_uint8(pil), backbone.preprocess(pil)):
        result = Scorer(backbone, progress=False).score([image, image], captions)
        # bit-equal: the same pixels and texts encoded in batches of the same shapes (same computation, any CPU)
        np.testing.assert_array_equal(result.scores, expected.scores)
    batch = torch.stack([backbone.preprocess(pil), backbone.preprocess(picture(1))])  # [N, 3, H, W]
    stacked = score(batch, captions, metric="clip-s", backbone=backbone)
    separate = score([pil, picture(1)], captions, metric="clip-s", backbone=backbone)
    np.testing.assert_array_equal(stacked.scores, separate.scores)


def test_grey_uint8_tensor_is_an_l_image(backbone):
    grey = Image.fromarray(np.arange(64 * 64, dtype=np.uint8).reshape(64, 64) % 251)
    tensor = torch.from_numpy(np.array(grey))[None]
    a = Scorer(backbone, progress=False).embed_images([tensor])
    b = Scorer(backbone, progress=False).embed_images([grey])
    assert torch.equal(a, b)


def test_tensor_cache_keys_are_content_hashes(backbone):
    scorer = Scorer(backbone, progress=False)
    first = as_uint8(picture(2))
    copy = first.clone()
    other = as_uint8(picture(3))
    assert image_key(first) == image_key(copy) != image_key(other)
    assert image_key(first).startswith("tensor:")
    scorer.embed_images([first, copy, other])
    assert scorer.images_encoded == 2  # the equal copy is not encoded again
    first[0, 0, 0] ^= 1  # changed in place: same object, new content, new embedding
    scorer.embed_images([first])
    assert scorer.images_encoded == 3
    as_float = first.float()
    assert image_key(as_float) != image_key(first)  # dtype is part of the identity


def test_bad_tensors_are_clear_errors(backbone):
    scorer = Scorer(backbone, progress=False)
    with pytest.raises(InputError, match=r"already preprocessed pixels of shape \[3, 64, 64\].*got \[3, 70, 50\]"):
        scorer.score([torch.zeros(3, 70, 50)], ["x"])
    with pytest.raises(InputError, match="unsupported image tensor dtype torch.int64"):
        scorer.score([torch.zeros(3, 8, 8, dtype=torch.long)], ["x"])
    with pytest.raises(InputError, match=r"\[C, H, W\] with C = 1 or 3"):
        scorer.score([torch.zeros(4, 8, 8, dtype=torch.uint8)], ["x"])
    with pytest.raises(InputError, match="image id 'img7'.*NaN"):
        scorer.score([torch.full((3, 64, 64), float("nan"))], ["x"], names=["img7"])


def test_rewards_and_trl_take_tensors(backbone):
    from pacs.rewards import build_reward
    from pacs.rewards.trl import reward_function

    pil = picture(5)
    tensors = {"a": as_uint8(pil)}
    expected = build_reward("clip-s", backbone=backbone, image_loader=lambda image_id: pil)(["a"], [["x", "y"]],
                                                                                           [[]])
    values = build_reward("clip-s", backbone=backbone, image_paths=tensors)(["a"], [["x", "y"]], [[]])
    assert torch.equal(values, expected)  # one image, two texts on both sides: the same batches, bit-equal
    fn = reward_function("clip-s", backbone=backbone)
    scores = fn(prompts=["p", "p"], completions=["x", "y"], image=[as_uint8(pil), backbone.preprocess(pil)])
    # the two tensors are two images to the cache (other dtypes): encoded in a batch of 2 here, of 1 for `expected`;
    # a batch of another size may round differently in an fp32 GEMM (a few ulp of scores up to w = 2.5)
    np.testing.assert_allclose(scores, expected[0].numpy(), rtol=1e-5, atol=1e-6)
