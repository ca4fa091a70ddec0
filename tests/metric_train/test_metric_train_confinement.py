"""Image paths read from a caption data set or a positives manifest stay inside the image root (issue 21 item 4):
lexically (no `..`, not absolute), symlinks inside the root followed (issue 33 item 6: the user's own folder)."""
from __future__ import annotations

import json

import pytest

from pacs.metric.common.errors import InputError
from pacs.metric.training.data import read_manifest
from pacs.metric.training.positives import read_caption_dataset


@pytest.fixture
def layout(tmp_path):
    root = tmp_path / "images"
    root.mkdir()
    (root / "a.jpg").write_bytes(b"x")
    (tmp_path / "secret.jpg").write_bytes(b"x")
    (root / "link.jpg").symlink_to(tmp_path / "secret.jpg")
    return tmp_path, root


@pytest.mark.parametrize("name", ["../secret.jpg", "sub/../a.jpg", "../missing.jpg", "/etc/hostname"])
def test_a_caption_dataset_file_name_outside_the_root_is_refused(layout, name):
    tmp_path, root = layout
    data = {"images": [{"cocoid": 7, "filepath": "", "filename": name, "split": "train",
                        "sentences": [{"raw": "a dog"}]}]}
    path = tmp_path / "karpathy.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match=r"images\[0\] \(image '7'\) file must be a path inside the image root .*: "
                                         r"a relative path without '\.\.'"):
        read_caption_dataset(path, root)
    for inside in ("a.jpg", "link.jpg"):  # a symlink inside the root is followed
        data["images"][0]["filename"] = inside
        path.write_text(json.dumps(data))
        assert read_caption_dataset(path, root)[0].path == root.resolve() / inside


def test_a_relative_manifest_path_outside_the_root_is_refused_an_absolute_one_is_taken(layout):
    tmp_path, root = layout
    row = {"image_id": "1", "caption_id": "1", "real_image": "a.jpg", "caption": "a", "gen_caption": "b",
           "gen_image": "../secret.jpg"}
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text(json.dumps(row) + "\n")
    with pytest.raises(InputError, match="manifest.jsonl line 1: gen_image must be a path inside the image root"):
        read_manifest(manifest, image_root=root)
    manifest.write_text(json.dumps(dict(row, gen_image=str(tmp_path / "secret.jpg"))) + "\n")
    record = read_manifest(manifest, image_root=root).records[0]
    assert record.gen_image == tmp_path / "secret.jpg" and record.real_image == root / "a.jpg"
