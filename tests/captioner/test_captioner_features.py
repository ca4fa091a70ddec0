"""Feature cache: extraction is resumable (done ids skipped), readable by id, and guarded against mix-ups."""
from __future__ import annotations

import pytest
import torch

from pacs.captioner.modeling.features import FeatureCache, extract_features
from pacs.metric.common.errors import InputError
from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config
from pacs.metric.models.grid import visual_grid_features

torch.set_num_threads(1)


def test_extraction_resumes_and_reads_back_exact_features(tmp_path, shared_data):
    backbone = build_backbone_from_config(tiny_clip_config(), seed=0)
    paths = sorted((shared_data / "flickr8k" / "images").glob("*.jpg"))[:5]
    images = {p.stem: p for p in paths}
    first = dict(list(images.items())[:3])
    extract_features(backbone, first, tmp_path / "cache", batch_size=2)
    shards = sorted((tmp_path / "cache" / "shards").iterdir())
    stamps = {p.name: p.stat().st_mtime_ns for p in shards}
    cache = extract_features(backbone, images, tmp_path / "cache", batch_size=2)
    new_shards = sorted((tmp_path / "cache" / "shards").iterdir())
    assert len(cache) == 5 and len(new_shards) == len(shards) + 1  # only the 2 new images were extracted
    assert all(p.stat().st_mtime_ns == stamps[p.name] for p in new_shards if p.name in stamps)
    from PIL import Image

    with Image.open(paths[4]) as image:
        expected = visual_grid_features(backbone, backbone.preprocess(image).unsqueeze(0))[0]
    reread = FeatureCache(tmp_path / "cache")
    assert torch.allclose(reread.get([paths[4].stem])[0], expected, atol=1e-6)
    with pytest.raises(InputError, match="'nope' is not in the feature cache"):
        reread.get(["nope"])
    other = build_backbone_from_config(tiny_clip_config(), seed=1)
    with pytest.raises(InputError, match="fingerprint"):
        extract_features(other, images, tmp_path / "cache")
    with pytest.raises(InputError, match="not found"):
        extract_features(backbone, {"x": tmp_path / "missing.jpg"}, tmp_path / "cache2")


def test_yaml_with_demo_section_is_delegated_to_the_demo(tmp_path, monkeypatch):
    import pacs.captioner.demo
    from pacs.captioner.entry import run_from_config

    calls = []
    monkeypatch.setattr(pacs.captioner.demo, "run_demo",
                        lambda path, overrides, force: calls.append((path, overrides, force)) or {})
    (tmp_path / "d.yaml").write_text("demo: {name: x}\n")
    run_from_config(str(tmp_path / "d.yaml"), ["demo.name=y"], force=["xe"])
    assert calls == [(str(tmp_path / "d.yaml"), ["demo.name=y"], ["xe"])]
