"""Fixtures for the metric tests: one thread, a tiny random backbone, small synthetic images."""
from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from pacs.metric.models.backbones import Backbone, build_backbone_from_config, tiny_clip_config
from pacs.metric.models.lora import attach_lora

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


@pytest.fixture(scope="session")
def aligned_backbone() -> Backbone:
    """A tiny random backbone whose final LayerNorm biases share one output direction (mostly positive cosines).

    The same trick as the official-format fixtures: random towers give cosines around 0, so half of all
    CLIP-S values would be clipped to 0 and tests comparing scores would compare zeros.
    """
    backbone = build_backbone_from_config(tiny_clip_config(), seed=1, name="tiny-aligned")
    model = backbone.model
    generator = torch.Generator().manual_seed(5)
    direction = torch.randn(model.text_projection.shape[1], generator=generator)
    with torch.no_grad():
        for norm, projection in ((model.visual.ln_post, model.visual.proj), (model.ln_final, model.text_projection)):
            bias = torch.linalg.lstsq(projection.T, direction[:, None]).solution[:, 0]
            norm.bias.copy_(2.0 * bias)
            norm.weight.mul_(0.5)
    from pacs.metric.models.backbones import model_fingerprint

    backbone.fingerprint = model_fingerprint(model, backbone.open_clip_config, backbone.preprocess)
    return backbone


@pytest.fixture(scope="session")
def tiny_family_folder(tmp_path_factory: pytest.TempPathFactory):
    """`get(name) -> folder` of the tiny backbone `name` (a key of `backbone_fixtures.BUILDERS`), built once."""
    from backbone_fixtures import BUILDERS

    built: dict[str, str] = {}

    def get(name: str) -> str:
        if name not in built:
            built[name] = BUILDERS[name](tmp_path_factory.mktemp(name.replace("-", "_")))
        return built[name]

    return get


@pytest.fixture(scope="session")
def tiny_open_clip_siglip(tiny_family_folder) -> str:
    """Folder of a tiny open_clip SigLIP-style model (local-dir layout), see tests/backbone_fixtures.py."""
    return tiny_family_folder("open_clip-siglip")


@pytest.fixture(scope="session")
def tiny_open_clip_siglip2(tiny_family_folder) -> str:
    """Folder of a tiny open_clip SigLIP2-style model (local-dir layout)."""
    return tiny_family_folder("open_clip-siglip2")


@pytest.fixture(scope="session")
def tiny_transformers_clip(tiny_family_folder) -> str:
    """Folder of a tiny transformers CLIPModel + CLIPProcessor."""
    return tiny_family_folder("transformers-clip")


@pytest.fixture(scope="session")
def tiny_transformers_siglip(tiny_family_folder) -> str:
    """Folder of a tiny transformers SiglipModel + SiglipProcessor."""
    return tiny_family_folder("transformers-siglip")


@pytest.fixture(scope="session")
def tiny_transformers_siglip2(tiny_family_folder) -> str:
    """Folder of a tiny transformers Siglip2Model + Siglip2Processor."""
    return tiny_family_folder("transformers-siglip2")


@pytest.fixture
def adapted(tiny_backbone):
    """The tiny CLIP with LoRA adapters whose B matrices are random (an untrained adapter adds nothing)."""
    backbone = dataclasses.replace(tiny_backbone, model=copy.deepcopy(tiny_backbone.model))
    backbone = attach_lora(backbone, rank=4, alpha=4.0)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in backbone.model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(0.05 * torch.randn(parameter.shape, generator=generator))
    backbone.model.eval()
    return backbone
