"""The feature reader copies each tensor out of its shard (issue 22): the same values as safetensors' own loader (from the bytes),
no shard mapped into the process, and a bounded number of shards open."""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load

from captioner.modeling import features as feature_module
from captioner.modeling.features import FeatureCache, write_feature_cache


def _mapped_files() -> set[str]:
    """Paths of the files this process has mapped (from /proc/self/maps)."""
    lines = Path("/proc/self/maps").read_text().splitlines()
    return {line.split(None, 5)[5] for line in lines if len(line.split(None, 5)) == 6}


def test_reader_equals_safetensors_maps_nothing_and_keeps_few_shards_open(tmp_path, monkeypatch):
    generator = torch.Generator().manual_seed(0)
    features = {f"img{i}": (torch.randn(7, 12, generator=generator) * 3).half() for i in range(40)}
    write_feature_cache(features, tmp_path / "cache", shard_size=4)  # 10 shards
    shards = sorted((tmp_path / "cache" / "shards").glob("shard-*.safetensors"))
    assert len(shards) == 10
    expected = {name: tensor for shard in shards for name, tensor in load(shard.read_bytes()).items()}
    assert set(expected) == set(features)

    monkeypatch.setattr(feature_module, "OPEN_SHARDS", 3)
    cache = FeatureCache(tmp_path / "cache")
    order = [f"img{i}" for i in (5, 39, 0, 17, 5, 22, 31, 8, 0, 13)]
    batch = cache.get(order)
    assert batch.dtype == torch.float32 and batch.shape == (10, 7, 12)
    for row, name in zip(batch, order):
        assert torch.equal(row, expected[name].float())
    assert len(cache._handles) == 3  # the three most recently used shards stay open, no more
    assert not {str(shard) for shard in shards} & _mapped_files()
    cache.close()
    assert not cache._handles and torch.equal(cache.get(["img39"])[0], expected["img39"].float())
