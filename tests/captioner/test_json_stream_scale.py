"""The Karpathy loader reads its `images` array one element at a time (issue 22): the same elements as json.loads,
the same one located error for a malformed file, and the full reader for any other shape."""
from __future__ import annotations

import json

import pytest

from pacs.captioner.data.json_stream import stream_array
from pacs.captioner.data.karpathy import load_karpathy
from pacs.captioner.data.parsing import read_json
from pacs.metric.common.errors import InputError


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


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_chunks_that_cut_elements_characters_and_numbers_give_the_same_elements(tmp_path, monkeypatch, chunk):
    """Chunks of 1, 7 and 64 bytes cut UTF-8 characters, strings, numbers and whitespace anywhere."""
    from pacs.captioner.data import json_stream

    monkeypatch.setattr(json_stream, "CHUNK_BYTES", chunk)
    path = tmp_path / "dataset_coco.json"
    for document in ({"images": _images(12), "dataset": "coco"},
                     {"images": [1, 23456, 7.5e3, -0.25, "Ünï", [1, [2]], {"a": None}, True, 123456789012]},
                     {"images": []}):
        for indent in (None, 3):
            path.write_text(json.dumps(document, indent=indent, ensure_ascii=False), encoding="utf-8")
            assert list(stream_array(path, "images")) == document["images"]
    # a surrogate pair escaped (valid JSON) anywhere, even across chunks: the full reader reads it, same elements
    path.write_text('{"images": [{"raw": "x \\ud83d\\ude00"}, 2]}', encoding="utf-8")
    assert list(stream_array(path, "images")) == [{"raw": "x \U0001F600"}, 2]


@pytest.mark.parametrize("chunk", [5, 64])
def test_malformed_files_read_in_small_chunks_are_the_full_readers_error(tmp_path, monkeypatch, chunk):
    from pacs.captioner.data import json_stream

    monkeypatch.setattr(json_stream, "CHUNK_BYTES", chunk)
    path = tmp_path / "dataset_coco.json"
    good = json.dumps({"images": _images(6), "dataset": "coco"}, indent=1)
    for broken in (good[:-40], good.replace('"split": "test"', '"split" "test"', 1), good[:-1] + "x}",
                   '{"images": [1, 2, ]}', '{"images": [1 2]}', '{"images": [1, 2]'):
        path.write_text(broken, encoding="utf-8")
        with pytest.raises(InputError) as error:
            list(stream_array(path, "images"))
        with pytest.raises(InputError) as full:
            read_json(path)
        assert str(error.value) == str(full.value), broken


def test_the_text_in_memory_is_about_one_chunk_not_the_file(tmp_path, monkeypatch):
    """A 4 MB file read in 64 KiB chunks: the Python memory held while streaming stays under 1/8 of the file (the
    former reader held the whole text, twice its size with the bytes), measured by tracemalloc."""
    import tracemalloc

    from pacs.captioner.data import json_stream

    monkeypatch.setattr(json_stream, "CHUNK_BYTES", 1 << 16)
    path = tmp_path / "dataset_coco.json"
    path.write_text(json.dumps({"images": _images(24000)}), encoding="utf-8")
    size = path.stat().st_size
    assert size > 4_000_000
    tracemalloc.start()
    try:
        count = sum(1 for _ in stream_array(path, "images"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 24000 and peak < size / 8
