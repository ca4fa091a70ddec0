"""Fixtures for the metric tests: one thread, a tiny random backbone, small synthetic images."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from metric.backbones import Backbone, build_backbone_from_config, tiny_clip_config

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_backbone() -> Backbone:
    """A tiny random ViT CLIP (64 px, 2 layers per tower), seed 0."""
    return build_backbone_from_config(tiny_clip_config(), seed=0, name="tiny-test")


@pytest.fixture(scope="session")
def image_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six small RGB PNG/JPEG images of different sizes, named img0 .. img5."""
    folder = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for index in range(6):
        height, width = 40 + 7 * index, 90 - 5 * index
        pixels = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
        suffix = "jpg" if index % 2 else "png"
        Image.fromarray(pixels).save(folder / f"img{index}.{suffix}")
    return folder


@pytest.fixture(scope="session")
def pacscore_fixtures(shared_fixtures: Path) -> Path:
    """The official-format fixtures folder (../shared/fixtures/pacscore)."""
    return shared_fixtures / "pacscore"
