"""Loaders of every caption data-set format, on small files written in the released formats."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from pacs.captioner.data import DATASETS, CaptionDataset, CaptionItem, DatasetConfig, load_dataset, load_dataset_config
from pacs.captioner.data.datasets import register_dataset
from pacs.metric.common.errors import InputError


def _image(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (4, 4), (10, 20, 30)).save(path)
    return path


def _sentence(raw: str, imgid: int, sentid: int) -> dict:
    return {"tokens": raw.lower().rstrip(" .").split(), "raw": raw, "imgid": imgid, "sentid": sentid}


def _coco_karpathy(tmp_path: Path) -> Path:
    images = []
    for imgid, (split, cocoid, folder) in enumerate([("train", 9, "train2014"), ("restval", 42, "val2014"),
                                                     ("val", 73, "val2014"), ("test", 74, "val2014")]):
        name = f"COCO_{folder}_{cocoid:012d}.jpg"
        _image(tmp_path / "images" / folder / name)
        images.append({"filepath": folder, "sentids": [2 * imgid, 2 * imgid + 1], "filename": name, "imgid": imgid,
                       "split": split, "cocoid": cocoid,
                       "sentences": [_sentence(f"A cat number {cocoid}.", imgid, 2 * imgid),
                                     _sentence(f"Another view of thing {cocoid}", imgid, 2 * imgid + 1)]})
    path = tmp_path / "dataset_coco.json"
    path.write_text(json.dumps({"images": images, "dataset": "coco"}))
    return path


def test_registry_lists_every_format():
    assert {"coco-karpathy", "flickr8k-karpathy", "flickr30k-karpathy", "flickr8k", "nocaps", "vizwiz",
            "cc3m"} <= set(DATASETS)


def test_unknown_dataset_lists_known_names(tmp_path):
    with pytest.raises(InputError, match="unknown dataset 'mscoco'.*coco-karpathy"):
        load_dataset("mscoco", tmp_path)


def test_register_dataset_is_one_decorated_function(tmp_path):
    @register_dataset("test-one-image")
    def load_one(path, image_root=None):
        return CaptionDataset("one", [CaptionItem("x", path, ["a dog"], "test")])
    try:
        dataset = load_dataset("TEST-ONE-IMAGE", _image(tmp_path / "x.jpg"))
        assert dataset.references() == {"x": ["a dog"]}
    finally:
        del DATASETS["test-one-image"]


def test_coco_karpathy_splits_and_restval(tmp_path):
    path = _coco_karpathy(tmp_path)
    dataset = load_dataset("coco-karpathy", path, image_root=tmp_path / "images")
    assert [i.image_id for i in dataset] == ["9", "42", "73", "74"]
    assert {k: len(v) for k, v in dataset.by_split().items()} == {"train": 2, "val": 1, "test": 1}
    assert dataset.items[1].extra["karpathy_split"] == "restval"
    assert dataset.report["restval_merged_into_train"] == 1
    assert dataset.references()["73"] == ["A cat number 73.", "Another view of thing 73"]
    assert dataset.items[2].image_path == tmp_path / "images/val2014/COCO_val2014_000000000073.jpg"
    kept = load_dataset("coco-karpathy", path, image_root=tmp_path / "images", merge_restval=False)
    assert [len(kept.split(s)) for s in ("train", "restval", "val", "test")] == [1, 1, 1, 1]
    tokens = load_dataset("coco-karpathy", path, image_root=tmp_path / "images", use_tokens=True)
    assert tokens.references()["73"][0] == "a cat number 73"  # the Karpathy tokens


def test_karpathy_missing_images_are_counted_skipped_or_required(tmp_path):
    path = _coco_karpathy(tmp_path)
    (tmp_path / "images/val2014/COCO_val2014_000000000074.jpg").unlink()
    skipped = load_dataset("coco-karpathy", path, image_root=tmp_path / "images")
    assert len(skipped) == 3 and skipped.report["missing_images"] == 1 and skipped.missing_image_ids == ["74"]
    kept = load_dataset("coco-karpathy", path, image_root=tmp_path / "images", missing_images="keep")
    assert len(kept) == 4 and kept.report["missing_images"] == 1
    with pytest.raises(InputError, match="1 of 4 images are missing.*'74'"):
        load_dataset("coco-karpathy", path, image_root=tmp_path / "images", missing_images="error")


@pytest.mark.parametrize("name", ["flickr8k", "flickr30k"])
def test_flickr_karpathy(tmp_path, name):
    images = [{"sentids": [0, 1], "imgid": 0, "split": "test", "filename": "1000268201_693b08cb0e.jpg",
               "sentences": [_sentence("A child climbs stairs .", 0, 0), _sentence("A girl .", 0, 1)]}]
    _image(tmp_path / "1000268201_693b08cb0e.jpg")
    (tmp_path / f"dataset_{name}.json").write_text(json.dumps({"images": images, "dataset": name}))
    dataset = load_dataset(f"{name}-karpathy", tmp_path)  # the folder holding the json (and the images)
    assert dataset.name == f"{name}-karpathy"
    assert dataset.references() == {"1000268201_693b08cb0e": ["A child climbs stairs .", "A girl ."]}
    assert dataset.items[0].split == "test" and dataset.items[0].extra["imgid"] == 0


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["images"][2].pop("split"), r"images\[2\]: missing key 'split'"),
    (lambda d: d["images"][1]["sentences"][1].update(raw="  "), r"images\[1\]\.sentences\[1\]\.raw: empty caption"),
    (lambda d: d["images"][0].update(split="dev"), r"images\[0\]\.split: unknown split 'dev'"),
    (lambda d: d["images"][3].update(cocoid=9), "image id '9' occurs twice"),
    (lambda d: d.pop("images"), "missing key 'images'"),
])
def test_karpathy_malformed_names_file_and_key(tmp_path, mutate, message):
    path = _coco_karpathy(tmp_path)
    data = json.loads(path.read_text())
    mutate(data)
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match=message) as error:
        load_dataset("coco-karpathy", path, image_root=tmp_path / "images")
    assert "dataset_coco.json" in str(error.value)


def test_invalid_json_names_line(tmp_path):
    path = tmp_path / "dataset_coco.json"
    path.write_text('{"images": [\n  {"filename": "a.jpg",,}\n]}')
    with pytest.raises(InputError, match=r"dataset_coco.json: line 2 column \d+: invalid JSON"):
        load_dataset("coco-karpathy", path)


def _nocaps(tmp_path: Path) -> Path:
    images = [{"id": i, "file_name": f"{oid}.jpg", "open_images_id": oid, "height": 4, "width": 4,
               "coco_url": f"https://example.org/{oid}.jpg", "domain": domain}
              for i, (oid, domain) in enumerate([("0013ea2087020901", "in-domain"),
                                                 ("00223ef6a1fe7ac4", "near-domain"),
                                                 ("003e4e6c1b6aa4d3", "out-domain")])]
    annotations = [{"image_id": i % 3, "id": i, "caption": f"caption {i} of image {i % 3}"} for i in range(30)]
    for image in images:
        _image(tmp_path / "validation" / image["file_name"])
    path = tmp_path / "nocaps_val_4500_captions.json"
    path.write_text(json.dumps({"licenses": [], "info": {}, "images": images, "annotations": annotations}))
    return path


def test_nocaps_domains(tmp_path):
    path = _nocaps(tmp_path)
    dataset = load_dataset("nocaps", path, image_root=tmp_path / "validation")
    assert [item.extra["domain"] for item in dataset] == ["in-domain", "near-domain", "out-domain"]
    assert all(len(item.captions) == 10 for item in dataset)
    assert dataset.references()["1"][0] == "caption 1 of image 1"
    assert dataset.items[0].extra["open_images_id"] == "0013ea2087020901"


def test_nocaps_bad_domain_and_dangling_annotation(tmp_path):
    path = _nocaps(tmp_path)
    data = json.loads(path.read_text())
    data["images"][1]["domain"] = "far-domain"
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match=r"images\[1\]\.domain: unknown domain 'far-domain'"):
        load_dataset("nocaps", path)
    data["images"][1]["domain"] = "near-domain"
    data["annotations"][7]["image_id"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match=r"annotations\[7\]\.image_id: 99 is not in images"):
        load_dataset("nocaps", path)


def test_vizwiz_drops_rejected_and_precanned_and_counts_them(tmp_path):
    images = [{"file_name": f"VizWiz_val_{i:08d}.jpg", "vizwiz_url": "https://example.org", "id": 23431 + i,
               "text_detected": bool(i)} for i in range(3)]
    flags = [(False, False), (True, False), (False, True), (True, True), (False, False),
             (False, False), (False, True), (False, False), (True, False), (True, False)]
    annotations = [{"caption": f"text {n}", "image_id": 23431 + n // 4 if n < 8 else 23433, "is_precanned": pre,
                    "is_rejected": rej, "id": 117155 + n, "text_detected": True}
                   for n, (rej, pre) in enumerate(flags)]
    (tmp_path / "annotations").mkdir()
    (tmp_path / "annotations" / "val.json").write_text(json.dumps({"info": {}, "images": images,
                                                                   "annotations": annotations}))
    for image in images:
        _image(tmp_path / "val" / image["file_name"])
    dataset = load_dataset("vizwiz", tmp_path)
    assert dataset.references() == {"23431": ["text 0"], "23432": ["text 4", "text 5", "text 7"]}
    assert dataset.report["dropped_rejected"] == 4  # rows 1, 3 (rejected and pre-canned), 8, 9
    assert dataset.report["dropped_precanned"] == 2  # rows 2 and 6
    assert dataset.report["images_without_captions"] == 1  # image 23433: only rejected captions
    assert dataset.items[1].image_path == tmp_path / "val" / "VizWiz_val_00000001.jpg"
    annotations[0]["is_rejected"] = "no"
    (tmp_path / "annotations" / "val.json").write_text(json.dumps({"images": images, "annotations": annotations}))
    with pytest.raises(InputError, match=r"val.json: annotations\[0\]\.is_rejected: expected true or false"):
        load_dataset("vizwiz", tmp_path)


def test_cc3m_img2dataset_files(tmp_path):
    for shard, key, caption in [("00000", "000000000", "a photo of a tree"),
                                ("00000", "000000001", "actor attends the premiere"),
                                ("00001", "000010000", "person walking in the city")]:
        _image(tmp_path / shard / f"{key}.jpg")
        (tmp_path / shard / f"{key}.txt").write_text(caption + "\n")
        (tmp_path / shard / f"{key}.json").write_text(json.dumps({"key": key, "caption": caption}))
    (tmp_path / "00000.parquet").write_bytes(b"PAR1")
    (tmp_path / "00000_stats.json").write_text("{}")
    dataset = load_dataset("cc3m", tmp_path)
    assert dataset.references() == {"000000000": ["a photo of a tree"], "000000001": ["actor attends the premiere"],
                                    "000010000": ["person walking in the city"]}
    assert dataset.items[2].image_path == tmp_path / "00001" / "000010000.jpg"
    (tmp_path / "00001" / "000010001.jpg").write_bytes(b"")
    with pytest.raises(InputError, match=r"000010001.jpg: image without its caption file"):
        load_dataset("cc3m", tmp_path)


def test_cc3m_tsv(tmp_path):
    _image(tmp_path / "imgs" / "a.jpg")
    _image(tmp_path / "imgs" / "b.png")
    tsv = tmp_path / "val.tsv"
    tsv.write_text("a tree in a field\timgs/a.jpg\nsome \"quoted\" text\timgs/b.png\nanother tree\timgs/a.jpg\n\n")
    dataset = load_dataset("cc3m", tsv)
    assert dataset.references() == {"imgs/a": ["a tree in a field", "another tree"], "imgs/b": ['some "quoted" text']}
    tsv.write_text("a tree\timgs/a.jpg\nno tab here\n")
    with pytest.raises(InputError, match=r"val.tsv: line 2: expected 'caption<TAB>path', got 1 fields"):
        load_dataset("cc3m", tsv)
    tsv.write_text("a tree\thttps://example.org/a.jpg\n")
    with pytest.raises(InputError, match=r"line 1: .* is a URL"):
        load_dataset("cc3m", tsv)


def test_dataset_config_from_yaml(tmp_path):
    from pacs.metric.common.config import load_config

    path = _coco_karpathy(tmp_path)
    yaml_path = tmp_path / "data.yaml"
    yaml_path.write_text(f"name: coco-karpathy\npath: {path}\nimage_root: {tmp_path / 'images'}\n")
    config = load_config(DatasetConfig, yaml_path, ["options.merge_restval=false"])
    assert len(load_dataset_config(config).split("restval")) == 1
    with pytest.raises(InputError, match="missing_images='sometimes'"):
        load_dataset("coco-karpathy", path, missing_images="sometimes")
    with pytest.raises(InputError, match="no split 'dev'"):
        load_dataset_config(config).split("dev")
