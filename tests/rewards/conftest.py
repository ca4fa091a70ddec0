"""Fixtures of the reward tests: a tiny random CLIP backbone and a few coloured images."""
from __future__ import annotations

import pytest
import torch
from PIL import Image


@pytest.fixture(scope="module")
def tiny_backbone():
    """A tiny randomly initialised open_clip ViT (pacs.metric.models.backbones), one thread."""
    from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config

    torch.set_num_threads(1)
    return build_backbone_from_config(tiny_clip_config(), seed=0)


@pytest.fixture(scope="module")
def images():
    """Three distinct PIL images keyed by image id."""
    return {"red": Image.new("RGB", (80, 64), (220, 20, 20)), "green": Image.new("RGB", (64, 90), (20, 200, 40)),
            "noise": Image.frombytes("RGB", (64, 64), bytes((i * 37) % 256 for i in range(64 * 64 * 3)))}


@pytest.fixture
def batch():
    """A reward batch: 2 images x k=3 sampled captions, with references."""
    return (["red", "green"],
            [["a red square", "A red box.", ""], ["a green field", "a dog", "green green green"]],
            [["a red square on white", "a red box"], ["a green field", "grass"]])
