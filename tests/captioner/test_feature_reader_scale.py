"""The feature reader copies each tensor out of its shard (issue 22): the same values as safetensors' own loader (from the bytes),
no shard mapped into the process, and a bounded number of shards open."""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load

from pacs.captioner.modeling import features as feature_module
from pacs.captioner.modeling.features import FeatureCache, write_feature_cache


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


def test_the_index_equals_the_dict_of_the_shards_even_with_an_id_in_two_shards(tmp_path):
    """The index read shard by shard answers what the dict `{id: shard}` of every shard (the last shard for an id
    written twice, as a re-extraction can leave) answers, for every id, and nothing for an unknown id."""
    generator = torch.Generator().manual_seed(1)
    features = {f"img{i}": torch.randn(3, 4, generator=generator) for i in range(30)}
    folder = tmp_path / "cache"
    write_feature_cache(features, folder, shard_size=8)  # 4 shards
    again = {"img3": torch.full((3, 4), 7.0), "img29": torch.full((3, 4), 9.0)}
    from safetensors.torch import save_file

    save_file(again, str(folder / "shards" / "shard-zz-again.safetensors"))  # sorts last: its ids win
    expected = feature_module._scan_index(folder)
    cache = FeatureCache(folder)
    assert {image_id: cache.index.get(image_id) for image_id in features} == expected
    assert len(cache) == 30 and sorted(cache.index) == sorted(features) and cache.index.get("img30") is None
    assert "img3" in cache and "img30" not in cache and cache.missing(["img1", "img30"]) == ["img30"]
    assert torch.equal(cache.get(["img3"])[0], again["img3"]) and torch.equal(cache.get(["img4"])[0], features["img4"])
