"""The raw Flickr8k release: `Flickr8k.token.txt` + `Flickr_8k.{train,dev,test}Images.txt` + `images/`."""
from __future__ import annotations

import logging
from pathlib import Path

from pacs.captioner.data.datasets import CaptionDataset, CaptionItem, register_dataset
from pacs.captioner.data.parsing import confined_root, image_file
from pacs.metric.common.errors import InputError

logger = logging.getLogger(__name__)

TOKEN_FILE = "Flickr8k.token.txt"
IMAGE_FOLDERS = ("images", "Flicker8k_Dataset")  # the second is the name in the original release
SPLIT_FILES = {"train": "Flickr_8k.trainImages.txt", "val": "Flickr_8k.devImages.txt",
               "test": "Flickr_8k.testImages.txt"}


def read_token_file(path: Path) -> dict[str, list[str]]:
    """Parse `img#k<TAB>caption` lines into `{file name: [captions in k order]}`; blank lines are ignored."""
    if not path.is_file():
        raise InputError(f"{path}: file not found (the raw Flickr8k captions)")
    captions: dict[str, dict[int, str]] = {}
    with open(path, encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            key, tab, caption = line.partition("\t")
            name, hash_sign, index = key.partition("#")
            if not tab or not hash_sign or not index.isdigit() or not name:
                raise InputError(f"{path}: line {line_number}: expected 'image.jpg#k<TAB>caption', got {line[:80]!r}")
            if not caption.strip():
                raise InputError(f"{path}: line {line_number}: empty caption for {key}")
            per_image = captions.setdefault(name, {})
            if int(index) in per_image:
                raise InputError(f"{path}: line {line_number}: caption {key} appears twice")
            per_image[int(index)] = caption.strip()
    return {name: [per_image[k] for k in sorted(per_image)] for name, per_image in captions.items()}


def read_split_file(path: Path) -> list[tuple[int, str]]:
    """Return `(line number, image file name)` for each non-blank line of a Flickr8k split list."""
    if not path.is_file():
        raise InputError(f"{path}: file not found (a raw Flickr8k split list)")
    rows = []
    with open(path, encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            name = line.strip()
            if not name:
                continue
            if "\t" in name or " " in name:
                raise InputError(f"{path}: line {line_number}: expected one image file name, got {name[:80]!r}")
            rows.append((line_number, name))
    return rows


def default_image_root(path: Path) -> Path:
    """`images/`, or the original release's `Flicker8k_Dataset/` when only that one exists."""
    for name in IMAGE_FOLDERS:
        if (path / name).is_dir():
            return path / name
    return path / IMAGE_FOLDERS[0]


@register_dataset("flickr8k")
def load_flickr8k_raw(path: Path, image_root: Path | None = None) -> CaptionDataset:
    """Raw Flickr8k folder; ids are file names without extension; split `dev` is named `val`."""
    if not path.is_dir():
        raise InputError(f"{path}: expected the folder holding {TOKEN_FILE} and the split lists")
    captions = read_token_file(path / TOKEN_FILE)
    root = confined_root(image_root if image_root is not None else default_image_root(path))
    items: list[CaptionItem] = []
    split_of: dict[str, str] = {}
    for split, file_name in SPLIT_FILES.items():
        split_path = path / file_name
        for line_number, name in read_split_file(split_path):
            if name in split_of:
                raise InputError(f"{split_path}: line {line_number}: image {name} is already in split {split_of[name]}")
            if name not in captions:
                raise InputError(f"{split_path}: line {line_number}: image {name} has no caption in {TOKEN_FILE}")
            split_of[name] = split
            image = image_file(root, name, f"{split_path}: line {line_number}")
            items.append(CaptionItem(Path(name).stem, image, captions[name], split, {"file_name": name}))
    unassigned = sorted(set(captions) - set(split_of))
    report = {"captioned_images_in_no_split": len(unassigned)}
    if unassigned:
        logger.info("flickr8k: %d captioned images are in no split list (e.g. %s)", len(unassigned), unassigned[0])
    return CaptionDataset("flickr8k", items, source=str(path), report=report)
