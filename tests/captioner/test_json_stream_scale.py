"""The Karpathy loader reads its `images` array one element at a time (issue 22): the same elements as json.loads,
the same one located error for a malformed file, and the full reader for any other shape."""
from __future__ import annotations

import json

import pytest

from captioner.data.json_stream import stream_array
from captioner.data.karpathy import load_karpathy
from captioner.data.parsing import read_json
from metric.common.errors import InputError


def _images(n: int) -> list[dict]:
    return [{"cocoid": i, "filepath": "val2014", "filename": f"{i}.jpg", "split": "train" if i % 3 else "test",
             "sentences": [{"raw": f"Ünï {i} \\\"quoted\\\" , x", "tokens": ["a", str(i)]}, {"raw": "b"}]}
            for i in range(n)]


@pytest.mark.parametrize("indent", [None, 2])
def test_stream_yields_what_json_loads_gives(tmp_path, indent):
    path = tmp_path / "dataset_coco.json"
    path.write_text(json.dumps({"images": _images(25), "dataset": "coco"}, indent=indent), encoding="utf-8")
    assert list(stream_array(path, "images")) == json.loads(path.read_text(encoding="utf-8"))["images"]
    path.write_text('{"images": [ ] }', encoding="utf-8")
    assert list(stream_array(path, "images")) == []
    path.write_text(json.dumps({"dataset": "coco", "images": _images(3)}), encoding="utf-8")  # another key first
    assert list(stream_array(path, "images")) == _images(3)


def test_malformed_file_is_the_full_readers_located_error(tmp_path):
    path = tmp_path / "dataset_coco.json"
    good = json.dumps({"images": _images(30), "dataset": "coco"}, indent=1)
    for broken in (good[:-200], good.replace('"split": "test"', '"split" "test"', 1), good[:-1] + "x}"):
        path.write_text(broken, encoding="utf-8")
        with pytest.raises(InputError) as error:
            list(stream_array(path, "images"))
        with pytest.raises(InputError) as full:
            read_json(path)
        assert str(error.value) == str(full.value)
        assert "invalid JSON" in str(error.value) and "line" in str(error.value) and str(path) in str(error.value)


def test_loader_gives_the_same_items_as_before(tmp_path):
    path = tmp_path / "dataset_coco.json"
    path.write_text(json.dumps({"images": _images(40)}), encoding="utf-8")
    dataset = load_karpathy(path, "coco")
    expected = [(str(i["cocoid"]), [s["raw"].strip() for s in i["sentences"]], i["split"]) for i in _images(40)]
    assert [(item.image_id, item.captions, item.split) for item in dataset.items] == expected
