"""The raw Flickr8k loader on the real shared files (1,000 of 8,091 images present) and on broken copies."""
from __future__ import annotations

import shutil

import pytest

from pacs.captioner.data import load_dataset
from pacs.metric.common.errors import InputError

SPLIT_FILES = ["Flickr_8k.trainImages.txt", "Flickr_8k.devImages.txt", "Flickr_8k.testImages.txt"]


def test_real_flickr8k_counts_missing_images(shared_data):
    dataset = load_dataset("flickr8k", shared_data / "flickr8k")
    # MANIFEST.md: the 1,000 local images are train 753 / dev 113 / test 125 (9 belong to no split).
    assert {name: len(sub) for name, sub in dataset.by_split().items()} == {"train": 753, "val": 113, "test": 125}
    assert dataset.report["missing_images"] == 8000 - 991
    assert len(dataset.missing_image_ids) == 7009
    # 8,092 captioned keys, 8,000 in a split list: the rest (incl. the `.jpg.1` quirk) are counted.
    assert dataset.report["captioned_images_in_no_split"] == 92
    assert all(len(item.captions) == 5 and item.image_path.is_file() for item in dataset)
    first = dataset.references()["1000268201_693b08cb0e"]
    assert first[0] == "A child in a pink dress is climbing up a set of stairs in an entry way ."


def test_real_flickr8k_keep_and_require(shared_data):
    kept = load_dataset("flickr8k", shared_data / "flickr8k", missing_images="keep")
    assert len(kept) == 8000 and len(kept.split("train")) == 6000
    with pytest.raises(InputError, match=r"7009 of 8000 images are missing, e.g. image '2513260012_03d33305cf'"):
        load_dataset("flickr8k", shared_data / "flickr8k", missing_images="error")


def _copy(shared_data, tmp_path):
    folder = tmp_path / "flickr8k"
    folder.mkdir()
    for name in ["Flickr8k.token.txt", *SPLIT_FILES]:
        shutil.copy(shared_data / "flickr8k" / name, folder / name)
    return folder


def test_malformed_token_line_names_file_and_line(shared_data, tmp_path):
    folder = _copy(shared_data, tmp_path)
    lines = (folder / "Flickr8k.token.txt").read_text().splitlines()
    lines[11] = lines[11].replace("\t", " ")
    (folder / "Flickr8k.token.txt").write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=r"Flickr8k.token.txt: line 12: expected 'image.jpg#k<TAB>caption'"):
        load_dataset("flickr8k", folder, missing_images="keep")


def test_split_image_without_captions_and_missing_split_file(shared_data, tmp_path):
    folder = _copy(shared_data, tmp_path)
    with open(folder / "Flickr_8k.devImages.txt", "a") as handle:
        handle.write("123_nothing.jpg\n")
    with pytest.raises(InputError, match=r"devImages.txt: line 1001: image 123_nothing.jpg has no caption"):
        load_dataset("flickr8k", folder, missing_images="keep")
    (folder / "Flickr_8k.devImages.txt").unlink()
    with pytest.raises(InputError, match=r"Flickr_8k.devImages.txt: file not found"):
        load_dataset("flickr8k", folder, missing_images="keep")


def test_original_release_image_folder_name(shared_data, tmp_path):
    folder = _copy(shared_data, tmp_path)
    (folder / "Flicker8k_Dataset").mkdir()
    name = "1000268201_693b08cb0e.jpg"
    shutil.copy(shared_data / "flickr8k" / "images" / name, folder / "Flicker8k_Dataset" / name)
    dataset = load_dataset("flickr8k", folder)
    assert [item.image_id for item in dataset] == ["1000268201_693b08cb0e"]
    assert dataset.items[0].split == "train" and dataset.report["missing_images"] == 7999
