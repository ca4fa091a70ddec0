"""Contrastive rewards key image embeddings by the image, not by the id (ids of different sets collide)."""
from __future__ import annotations

from pathlib import Path

import torch

from pacs.metric.scoring.registry import default_w
from pacs.metric.scoring.scorer import Scorer
from pacs.rewards import RewardResources, build_reward


def _expected(backbone, path: Path, captions: list[str]) -> torch.Tensor:
    """CLIP-S of `captions` against one image, from a fresh scorer (shares no cache with the reward)."""
    result = Scorer(backbone, progress=False).score([str(path)] * len(captions), captions,
                                                    w=default_w("clip-s", backbone))
    return torch.from_numpy(result.scores)


def test_same_id_other_image_gets_its_own_embedding(tiny_backbone, shared_data):
    first, second = sorted((shared_data / "flickr8k" / "images").glob("*.jpg"))[:2]
    captions = [["a dog runs on the grass", "two people"]]
    resources = RewardResources()  # shared, as the rewards of one run share it
    coco = build_reward("clip-s", backbone=tiny_backbone, image_paths={"1": first}, resources=resources)
    nocaps = build_reward("clip-s", backbone=tiny_backbone, image_paths={"1": second}, resources=resources)
    a, b = coco(["1"], captions, [[]]), nocaps(["1"], captions, [[]])
    assert torch.allclose(a[0], _expected(tiny_backbone, first, captions[0]), atol=1e-6)
    assert torch.allclose(b[0], _expected(tiny_backbone, second, captions[0]), atol=1e-6)  # before: a's image
    assert not torch.allclose(a, b)


def test_one_scorer_shared_by_two_contexts_still_tells_the_images_apart(tiny_backbone, shared_data):
    first, second = sorted((shared_data / "flickr8k" / "images").glob("*.jpg"))[:2]
    scorer = Scorer(tiny_backbone, progress=False)  # `scorers=` as the pipeline passes them
    captions = [["a brown dog"]]
    one = build_reward("clip-s", scorers={"clip-s": scorer}, image_paths={"7": first})(["7"], captions, [[]])
    two = build_reward("clip-s", scorers={"clip-s": scorer}, image_paths={"7": second})(["7"], captions, [[]])
    assert torch.allclose(one[0], _expected(tiny_backbone, first, captions[0]), atol=1e-6)
    assert torch.allclose(two[0], _expected(tiny_backbone, second, captions[0]), atol=1e-6)  # before: reward-image:7
    assert scorer.images_encoded == 2
