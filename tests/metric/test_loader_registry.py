"""`load_backbone` asks one loader per backbone family (pacs.metric.models.loader_registry): which one takes what."""
from __future__ import annotations

import json
from pathlib import Path

import open_clip
import pytest
from safetensors.torch import save_file

from pacs.metric.models.backbones import build_backbone_from_config, save_backbone, tiny_clip_config
from pacs.metric.models.factory import FAMILY_LOADERS
from pacs.metric.models.loader_registry import LoadRequest, select_loader


def _routed(**request) -> str:
    if request.get("checkpoint") is not None:
        request["checkpoint"] = Path(request["checkpoint"])
    loader = select_loader(LoadRequest(**request), FAMILY_LOADERS)
    return loader.name if loader is not None else "none"


def test_every_loader_has_a_unique_name_and_the_protocol():
    names = [loader.name for loader in FAMILY_LOADERS]
    assert len(set(names)) == len(names) == 6
    assert all(callable(loader.detect) and callable(loader.build) for loader in FAMILY_LOADERS)


@pytest.mark.parametrize(("family", "expected"), [
    ("open_clip-siglip", "open_clip-siglip"), ("open_clip-siglip2", "open_clip-siglip"),
    ("transformers-clip", "transformers"), ("transformers-siglip", "transformers"),
    ("transformers-siglip2", "transformers")])
def test_each_family_folder_goes_to_its_loader(family, expected, tiny_family_folder):
    folder = tiny_family_folder(family)
    assert _routed(checkpoint=folder) == expected
    if family.startswith("open_clip"):
        assert _routed(backbone=f"local-dir:{folder}") == expected


def test_names_files_and_clip_folders_go_to_their_loaders(tmp_path, pacscore_fixtures, tiny_open_clip_siglip,
                                                          monkeypatch):
    assert _routed(backbone="tiny-random") == "open_clip-clip"
    assert _routed(backbone="ViT-B-32/openai") == "open_clip-clip"
    assert _routed(backbone="ViT-B-16-SigLIP") == "open_clip-siglip"  # its text tower reads an HF tokenizer
    assert _routed(checkpoint=pacscore_fixtures / "A" / "PAC++_tiny_A.pth") == "official-state-dict"
    built = build_backbone_from_config(tiny_clip_config(), seed=1)
    assert _routed(checkpoint=save_backbone(built, tmp_path / "tiny.safetensors")) == "pacs-checkpoint"
    clip_dir = tmp_path / "clip"
    clip_dir.mkdir()
    save_file({key: value.contiguous() for key, value in built.model.state_dict().items()},
              str(clip_dir / "open_clip_model.safetensors"))
    (clip_dir / "open_clip_config.json").write_text(json.dumps(
        {"model_cfg": tiny_clip_config(), "preprocess_cfg": {"mean": [0.5] * 3, "std": [0.5] * 3}}))
    assert _routed(checkpoint=clip_dir) == "open_clip-clip"
    assert _routed(backbone=f"local-dir:{clip_dir}") == "open_clip-clip"
    # a SigLIP name + its weights file: the name's family, although the file is a safetensors file
    config = json.loads((Path(tiny_open_clip_siglip) / "open_clip_config.json").read_text())["model_cfg"]
    monkeypatch.setitem(open_clip.factory._MODEL_CONFIGS, "tiny-siglip-test", config)
    weights = Path(tiny_open_clip_siglip) / "open_clip_model.safetensors"
    assert _routed(backbone="tiny-siglip-test", checkpoint=weights) == "open_clip-siglip"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _routed(checkpoint=empty) == "none"  # load_backbone names what a folder should hold
