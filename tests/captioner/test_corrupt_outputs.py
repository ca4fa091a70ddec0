"""Every reader of a file pacs wrote (captioner folders, vocabularies, feature caches) turns corruption into one
clear InputError naming the file, or rebuilds what is only a convenience (issue 21 item 2)."""
from __future__ import annotations

import json

import pytest
import torch
from captioner_testkit import tiny_checkpoint, tiny_data

from pacs.captioner.modeling.checkpoints import load_captioner
from pacs.captioner.modeling.features import FeatureCache
from pacs.captioner.modeling.vocab import load_vocab
from pacs.metric.common.errors import InputError


@pytest.mark.parametrize("damage", ["truncate-model", "bad-json", "not-an-object"])
def test_a_damaged_captioner_folder_is_one_clear_error(tmp_path, damage):
    folder = tiny_checkpoint(tmp_path)
    if damage == "truncate-model":
        model = folder / "model.safetensors"
        model.write_bytes(model.read_bytes()[:100])
        match = "model.safetensors is unreadable"
    elif damage == "bad-json":
        (folder / "captioner.json").write_text("{")
        match = "captioner.json: invalid JSON"
    else:
        (folder / "captioner.json").write_text("5")
        match = "captioner.json"
    with pytest.raises(InputError, match=match):
        load_captioner(folder)


@pytest.mark.parametrize("content", [b"{", b"\xff\xfe", b"[1]", b"[" * 100000])
def test_a_damaged_vocabulary_is_one_clear_error(tmp_path, content):
    path = tmp_path / "vocab.json"
    path.write_bytes(content)
    with pytest.raises(InputError, match="vocab.json"):
        load_vocab(path)


def test_a_truncated_feature_shard_or_meta_is_one_clear_error_and_a_bad_index_is_rebuilt(tmp_path):
    cache, _, _ = tiny_data(tmp_path)
    expected = cache.get(["img0", "img5"])
    folder = tmp_path / "feats"
    (folder / "index.json").write_text("[")  # only a convenience: the shards are listed again
    assert FeatureCache(folder).get(["img0", "img5"]).equal(expected)
    (folder / "index.json").write_text(json.dumps({"shards": 3}))
    assert FeatureCache(folder).get(["img0"]).equal(expected[:1])
    (shard,) = sorted((folder / "shards").glob("shard-*.safetensors"))[:1]
    shard.write_bytes(shard.read_bytes()[:50])
    (folder / "index.json").unlink()
    with pytest.raises(InputError, match=f"feature shard {shard} is unreadable"):
        FeatureCache(folder).get(["img0"])
    (folder / "meta.json").write_text("[")
    with pytest.raises(InputError, match="meta.json is unreadable"):
        FeatureCache(folder)


def test_features_are_written_in_bounded_shards_from_a_stream(tmp_path, monkeypatch):
    """write_feature_cache takes a generator and never holds more than one shard (issue 22)."""
    from pacs.captioner.modeling import features as feature_module

    monkeypatch.setattr(feature_module, "MAX_SHARD_BYTES", 3 * 5 * 16 * 4)  # three [5, 16] fp32 tensors
    produced: list[str] = []
    peak = {"pending": 0}
    original_add = feature_module.ShardWriter.add

    def add(self, image_id, tensor):
        original_add(self, image_id, tensor)
        peak["pending"] = max(peak["pending"], len(self.pending))

    monkeypatch.setattr(feature_module.ShardWriter, "add", add)

    def stream():
        for index in range(10):
            produced.append(f"img{index}")
            yield f"img{index}", torch.full((5, 16), float(index))

    cache = feature_module.write_feature_cache(stream(), tmp_path / "feats", shard_size=1000)
    shards = sorted((tmp_path / "feats" / "shards").glob("shard-*.safetensors"))
    assert len(shards) == 4 and peak["pending"] <= 3  # 3 + 3 + 3 + 1 images, whatever shard_size asked for
    assert cache.ids() == sorted(produced)
    assert all(cache.get([f"img{i}"])[0].eq(float(i)).all() for i in range(10))
    with pytest.raises(InputError, match=r"image 'b' has features of shape \(4, 16\)"):
        feature_module.write_feature_cache([("a", torch.zeros(5, 16)), ("b", torch.zeros(4, 16))], tmp_path / "x")
